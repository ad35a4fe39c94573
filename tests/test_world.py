"""The world stage: determinism, the truth file against the bytes it labels, tokenizer, config, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from params_file import write_params
from rlhf.cli.app import app
from rlhf.pipeline.config import ConfigError, build
from rlhf.pipeline.world import WorldConfig, run
from rlhf.pipeline.world.judge import gold_score
from rlhf.pipeline.world.sources import FILES
from rlhf.pipeline.world.tokenizer import llama_param_count
from rlhf.store.schemas import EXTERNAL_ONLY_CODES, REASON_CODES
from typer.testing import CliRunner

SMALL = {"n_prompts": 600, "n_demos": 400, "tokenizer_vocab": 600, "long_prompt_words": 1100}
PROVENANCE = {"human": ("writer_id", "written_at"), "user_query": ("session_id", "timestamp"),
              "open_dataset": ("dataset", "preference_score")}
# Independent, deliberately simple detectors: a clean row must trigger none of them.
URL = re.compile(r"https?://|www\.", re.IGNORECASE)
EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")
PHONE = re.compile(r"\+?\(?\d{2,4}\)?[ -]\d{2,4}[ -]?\d{2,4}")
CODE = re.compile(r"```|\n {4}\S")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("world")
    report = run(build(WorldConfig, {**SMALL, "seed": 5}, "world"), out)
    return out, report


def test_same_seed_byte_identical_other_seed_different(world, tmp_path):
    out, _ = world
    again = tmp_path / "again"
    run(build(WorldConfig, {**SMALL, "seed": 5}, "world"), again)  # trains the tokenizer again
    assert _files(out) == _files(again)
    other = tmp_path / "other"
    run(build(WorldConfig, {**SMALL, "seed": 6}, "world"), other)
    a, b = _files(out), _files(other)
    for name in (*FILES.values(), "truth.jsonl", "demonstrations.jsonl"):
        assert a[name] != b[name], name


def _truth(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "truth.jsonl").read_text().splitlines()]


def test_truth_labels_every_line_and_matches_the_bytes(world):
    out, report = world
    truth = _truth(out)
    lines = {f: (out / f).read_bytes().split(b"\n")[:-1] for f in FILES.values()}
    assert len(truth) == sum(len(v) for v in lines.values()) == SMALL["n_prompts"]
    assert {(t["file"], t["line"]) for t in truth} == {
        (f, i + 1) for f, v in lines.items() for i in range(len(v))}
    texts = {}
    for t in truth:
        raw = lines[t["file"]][t["line"] - 1]
        codes = t["expected"]
        assert set(codes) <= set(REASON_CODES) and codes == sorted(set(codes))
        if codes == ["invalid_utf8"]:
            with pytest.raises(UnicodeDecodeError):
                raw.decode("utf-8")
            continue
        line = raw.decode("utf-8")
        if codes == ["bad_json"]:
            try:
                assert not isinstance(json.loads(line), dict)
            except json.JSONDecodeError:
                pass
            continue
        row = json.loads(line)
        assert isinstance(row, dict)
        text = row.get("text")
        if "bad_type" in codes:
            assert not isinstance(text, str) or not isinstance(row.get("preference_score"),
                                                                (int, float))
            continue
        stype = row.get("source_type")
        assert ("unknown_source" in codes) == (stype not in PROVENANCE), t
        if stype in PROVENANCE:
            missing = any(row.get(k) in (None, "") for k in PROVENANCE[stype])
            assert ("missing_provenance" in codes) == missing, t
        if stype == "open_dataset" and isinstance(row.get("preference_score"), float):
            assert ("low_preference" in codes) == (row["preference_score"] <= 0.8), t
        assert ("empty" in codes) == (not text.strip()), t
        assert ("too_long" in codes) == (len(text.split()) > 1024), t  # > 4x a 256 limit
        for code, rx in (("url", URL), ("email", EMAIL), ("phone", PHONE), ("code_block", CODE)):
            assert (code in codes) == bool(rx.search(text)), (code, text)
        if not codes:
            assert t["file"] == FILES[stype]
            texts[(t["file"], t["line"])] = text
            assert t["topic"] is not None
    # Duplicates: clean, pointing at a clean original that is itself no duplicate.
    by_pos = {(t["file"], t["line"]): t for t in truth}
    kinds = {"exact": 0, "paraphrase": 0}
    for t in truth:
        if t["dup_of"] is None:
            assert t["dup_kind"] is None
            continue
        kinds[t["dup_kind"]] += 1
        orig = by_pos[(t["dup_of"]["file"], t["dup_of"]["line"])]
        assert t["expected"] == [] and orig["expected"] == [] and orig["dup_of"] is None
        assert orig["topic"] == t["topic"]
        same = texts[(t["file"], t["line"])] == texts[(orig["file"], orig["line"])]
        assert same == (t["dup_kind"] == "exact")
    originals = [texts[k] for k, t in by_pos.items() if t["expected"] == [] and not t["dup_of"]]
    assert len(originals) == len(set(originals)) == report["sources"]["unique_questions"]
    assert kinds == report["sources"]["duplicates"] and all(kinds.values())


def test_report_counts_add_up_against_truth(world):
    out, report = world
    truth = _truth(out)
    src = report["sources"]
    assert src["lines"] == len(truth) == src["clean_rows"] + src["defect_rows"]
    for code in set(REASON_CODES) - EXTERNAL_ONLY_CODES:  # every filter of ingest has real work
        n = sum(code in t["expected"] for t in truth)
        assert n > 0 and src["defect_rows_per_code"][code] == n, code
    assert src["multi_code_rows"] == sum(len(t["expected"]) > 1 for t in truth) > 0
    for f, n in src["defect_rows_per_file"].items():
        assert n == sum(1 for t in truth if t["file"] == f and t["expected"])
        assert src["lines_per_file"][f] == sum(1 for t in truth if t["file"] == f)
    assert json.loads((out / "report.json").read_text()) == report


def test_demonstrations_have_mixed_quality_and_headroom(world):
    out, report = world
    demos = [json.loads(line) for line in (out / "demonstrations.jsonl").read_text().splitlines()]
    assert len(demos) == SMALL["n_demos"]
    assert {d["quality"] for d in demos} == {"good", "filler", "wrong_topic", "repetitive",
                                             "too_short", "too_long"}
    by = report["demonstrations"]["by_quality"]
    assert all(by["good"]["gold_mean"] > v["gold_mean"] + 1.0 for q, v in by.items() if q != "good")
    assert by["good"]["gold_mean"] < 5.0 and report["demonstrations"]["gold_mean"] < 3.5
    d = demos[0]
    assert gold_score(d["prompt"], d["response"]) >= 0
    assert len({d["response"] for d in demos}) > 0.9 * len(demos)  # varied text


def test_tokenizer_and_model_config_load_offline(world):
    from transformers import AutoTokenizer, LlamaConfig

    out, report = world
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    assert len(tok) == report["tokenizer"]["vocab_size"] == SMALL["tokenizer_vocab"]
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    text = "Why do leaves look green? Chlorophyll reflects green light."
    assert tok.decode(tok(text)["input_ids"]) == text
    cfg = LlamaConfig.from_pretrained(str(out / "model_config"))
    assert cfg.vocab_size == len(tok)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)


def test_default_model_shape_is_tiny_and_param_count_is_exact():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = WorldConfig().model
    cfg = LlamaConfig(vocab_size=3000, tie_word_embeddings=True, **vars(shape))
    torch.manual_seed(0)
    n = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    assert n == llama_param_count(3000, shape.hidden_size, shape.intermediate_size,
                                  shape.num_hidden_layers, shape.num_attention_heads,
                                  shape.num_key_value_heads, True)
    assert 1_000_000 <= n <= 5_000_000


def test_config_validation():
    with pytest.raises(ConfigError, match="defect_rate"):
        build(WorldConfig, {"defect_rate": 1.5}, "world")
    with pytest.raises(ConfigError, match="source_mix"):
        build(WorldConfig, {"source_mix": {"human": 1.0}}, "world")
    with pytest.raises(ConfigError, match="demo_mix"):
        build(WorldConfig, {"demo_mix": {"great": 1.0}}, "world")


def test_cli_generate_and_clean_errors(tmp_path):
    runner = CliRunner()
    params = tmp_path / "params.yaml"
    write_params(params, world={**SMALL, "n_prompts": 200, "n_demos": 100})
    out = tmp_path / "w"
    metrics, report = tmp_path / "m" / "world.json", tmp_path / "r" / "world.json"
    res = runner.invoke(app, ["world", "generate", "--seed", "3", "--out", str(out),
                              "--params", str(params), "--metrics", str(metrics),
                              "--report", str(report)])
    assert res.exit_code == 0, res.output
    assert "defect: phone" in res.output and "tokenizer vocab" in res.output
    assert json.loads(report.read_text())["seed"] == 3  # the details: the report
    assert json.loads(metrics.read_text())["sources"]["lines"] == 200  # the headline
    assert len(_truth(out)) == 200
    params.write_text("world:\n  n_promts: 5\n")
    res = runner.invoke(app, ["world", "generate", "--out", str(out), "--params", str(params)])
    assert res.exit_code == 2 and "unknown key(s) 'n_promts'" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("n, defects, exact, para", [(1, 0.6, 0.0, 0.1), (7, 0.2, 0.05, 0.1),
                                                      (50, 0.5, 0.2, 0.2), (400, 0.0, 0.0, 0.0)])
def test_source_line_count_is_exact_for_any_size(n, defects, exact, para):
    import random

    from rlhf.pipeline.world.sources import generate

    by_file, gen = generate(random.Random(n), n, {"human": 1.0, "user_query": 1.0,
                                                  "open_dataset": 1.0}, defects, exact, para, 400)
    c = gen["counts"]
    assert sum(len(v) for v in by_file.values()) == c["lines"] == n
    assert c["clean_rows"] + c["defect_rows"] == n
    assert c["unique_questions"] + sum(c["duplicates"].values()) == c["clean_rows"]
