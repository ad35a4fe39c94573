"""The realdata profile end to end: `dvc repro` of profiles/realdata/dvc.yaml (the shipped file,
unchanged) on real-format files the test writes (MT-bench, hh-rlhf, OpenAssistant, the user's own
prompts and annotation queue), with a small base model the test saves locally (no hub): every
stage runs, the base model's tokenizer reaches the SFT policy and the RMs, the verdicts name the
held-out gold RM, and `rlhf audit sources` shows the source types with kept / rejected counts."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

QUESTIONS = [
    "How do I keep basil alive on a windowsill?", "Why is the ocean salty?",
    "What should I pack for a week of winter hiking?", "How can I stop procrastinating on homework?",
    "Why do cats purr?", "What is a good way to learn chess openings?",
    "How do vaccines train the immune system?", "Why does bread go stale?",
    "How do I fix a squeaky door hinge?", "What makes a rainbow appear?",
    "How should I prepare for a job interview?", "Why do leaves change colour in autumn?",
    "How do I calm down before public speaking?", "What causes thunder?",
    "How do I remove a coffee stain from a shirt?", "Why do we dream?",
    "How can I save money on groceries?", "What is the difference between a virus and bacteria?",
    "How do I start running if I am out of shape?", "Why is the sky dark at night?",
    "How do bees make honey?", "What is inflation in simple terms?",
    "How do I teach a dog to sit?", "Why do onions make you cry?",
    "How do I write a cover letter?", "What causes earthquakes?",
    "How do I get better sleep?", "Why does ice float on water?",
    "How do I care for a cast iron pan?", "What is photosynthesis?",
    "How do I negotiate a higher salary?", "Why do birds migrate?",
    "How do I make my handwriting neater?", "What is compound interest?",
    "How can I reduce stress at work?", "Why do we have leap years?",
    "How do I choose a good watermelon?", "What makes volcanoes erupt?",
    "How do I apologise to a friend?", "Why do stars twinkle?",
]


def _write_realdata(folder: Path) -> None:
    folder.mkdir(parents=True)
    with open(folder / "FastChat__mt_bench_question.jsonl", "w") as fh:
        for i, q in enumerate(["Write a haiku about the first snow of the year.",
                               "Explain how a refrigerator keeps food cold.",
                               "Plan a three-day visit to a city you love."]):
            fh.write(json.dumps({"question_id": 81 + i, "category": "writing",
                                 "turns": [q, "Now make it shorter."]}) + "\n")
    buf = io.StringIO()
    for i, q in enumerate(QUESTIONS[:30]):
        good = f"A helpful answer: {q.lower().rstrip('?')} depends on patience and practice."
        buf.write(json.dumps({"chosen": f"\n\nHuman: {q}\n\nAssistant: {good}",
                              "rejected": f"\n\nHuman: {q}\n\nAssistant: I don't know."}) + "\n")
    # no human turn: an hh-rlhf row the adapter cannot read (quarantine: bad_record)
    buf.write(json.dumps({"chosen": "\n\nAssistant: hi", "rejected": "\n\nAssistant: yo"}) + "\n")
    with gzip.open(folder / "hh-rlhf__harmless-base_test.jsonl.gz", "wt") as fh:
        fh.write(buf.getvalue())
    with open(folder / "Open-Assistant__en_100_tree.jsonl", "w") as fh:
        for i, q in enumerate(QUESTIONS[30:]):
            replies = [{"role": "assistant", "text": f"Here is a clear answer to: {q}", "rank": 0},
                       {"role": "assistant", "text": "Maybe.", "rank": 1},
                       {"role": "assistant", "text": "Ask someone else.", "rank": 2}]
            tree = {"message_tree_id": f"t{i}", "tree_state": "ready_for_export",
                    "prompt": {"message_id": f"m{i}", "role": "prompter", "text": q,
                               "synthetic": i == 0, "replies": replies}}
            fh.write(json.dumps(tree) + "\n")


def _save_base_model(folder: Path, corpus: list[str]) -> int:
    """A small causal LM saved locally, as a user's `sft.base_model` would be."""
    import torch
    from rlhf.pipeline.world.tokenizer import train_tokenizer
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    vocab = train_tokenizer(corpus, 400, folder)
    tok = AutoTokenizer.from_pretrained(str(folder))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=256, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return vocab


@pytest.mark.slow
def test_realdata_profile_repro_end_to_end(tmp_path):
    root = tmp_path / "clone"
    for name in ("pipeline", "cli", "store"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    profile = root / "profiles" / "realdata"
    shutil.copytree(REPO / "profiles" / "realdata", profile,
                    ignore=shutil.ignore_patterns("artifacts", "dvc.lock", ".gitignore"))
    _write_realdata(tmp_path / "shared" / "realdata")  # ../../../shared/realdata of the profile
    # the user's own prompts: one without its writer (quarantine: missing_provenance)
    with open(profile / "data" / "prompts" / "team_prompts.jsonl", "a") as fh:
        fh.write(json.dumps({"text": "What is a good name for a goldfish?", "source_type": "human",
                             "written_at": "2026-01-20"}) + "\n")
    corpus = QUESTIONS + ["A helpful answer depends on patience and practice.",
                          "Here is a clear answer to the question."] * 5
    base = tmp_path / "base_model"
    vocab = _save_base_model(base, corpus)
    params = yaml.safe_load((profile / "params.yaml").read_text())
    params["sft"]["base_model"] = str(base)
    params["demos"]["max_demos"] = 0
    (profile / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    dvc = [str(Path(sys.executable).parent / "dvc")]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=root, check=True, env=env)
    res = subprocess.run([*dvc, "repro"], cwd=profile, env=env, capture_output=True, text=True,
                         check=False,
                         timeout=1500)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    lock = yaml.safe_load((profile / "dvc.lock").read_text())
    assert set(lock["stages"]) == {"ingest", "dedup", "preferences", "judge", "demos", "sft",
                                   "reward", "difficulty", "route", "ppo", "eval"}
    art = profile / "artifacts"
    # every stage's report (artifacts/reports/, the details) and its headline metrics file
    reports = sorted((art / "reports").glob("*.json"))
    metrics = {p.stem: json.loads(p.read_text()) for p in reports
               if not p.name.endswith(".timings.json")}
    headlines = {p.stem for p in (art / "metrics").glob("*.json")}
    assert headlines == set(metrics) == set(lock["stages"])
    # the wall-clock figures lie beside the reports, one per timed stage, declared by no stage
    timings = {p.name.removesuffix(".timings.json") for p in reports
               if p.name.endswith(".timings.json")}
    assert timings and timings <= set(lock["stages"])
    declared = {o["path"] for st in lock["stages"].values() for o in st.get("outs", [])}
    assert declared and not any(".timings." in o for o in declared)

    # the verdicts come from the held-out gold RM and say so
    judge = "heldout_gold_rm:artifacts/models/judge"
    assert metrics["eval"]["eval"]["judge"] == judge
    assert metrics["ppo"]["heldout"]["judge"] == judge
    assert metrics["sft"]["judge"] == judge and metrics["reward"]["judge"] == judge
    assert f"Judge: `{judge}`" in (art / "eval" / "report.md").read_text()
    # the gold RM trained on labels no proxy saw
    assert metrics["judge"]["n_gold_pairs"] > 0
    assert metrics["preferences"]["n_pairs_gold"] == metrics["judge"]["n_gold_pairs"]

    # the base model's tokenizer everywhere: SFT policy, the RM members, the PPO policy
    from transformers import AutoConfig, AutoTokenizer

    base_vocab = AutoTokenizer.from_pretrained(str(base)).get_vocab()
    assert len(base_vocab) == vocab
    for folder in (art / "models" / "sft", art / "models" / "rm_strong" / "member_0",
                   art / "models" / "rm_light", art / "ppo" / "policy"):
        assert AutoTokenizer.from_pretrained(str(folder)).get_vocab() == base_vocab, folder
    assert AutoConfig.from_pretrained(str(art / "models" / "sft")).vocab_size == vocab

    # the audit: every source type with kept / rejected counts that match ingest
    out = subprocess.run([str(Path(sys.executable).parent / "rlhf"), "audit", "sources",
                          "--store", str(art / "store"), "--format", "csv"], cwd=profile,
                         env=env, capture_output=True, text=True, check=True).stdout
    rows = {r["source_type"]: r for r in csv.DictReader(out.splitlines())}
    assert set(rows) == {"human", "open_dataset", "user_query"}
    ing = metrics["ingest"]
    assert sum(int(r["kept"]) for r in rows.values()) == ing["kept"]
    assert sum(int(r["rejected"]) for r in rows.values()) == ing["rejected"]
    assert int(rows["human"]["rejected"]) == 1  # the goldfish prompt without its writer
    assert int(rows["open_dataset"]["rejected"]) == 2  # the bad hh row, the synthetic OA prompt
    assert int(rows["open_dataset"]["kept"]) == 3 + 30 + 9
    assert int(rows["open_dataset"]["rollouts"]) > 0
    # a second repro has nothing to do
    res = subprocess.run([*dvc, "status", "dvc.yaml"], cwd=profile, env=env,
                         capture_output=True, text=True, check=False)
    assert "up to date" in res.stdout, res.stdout


def test_profile_params_valid_and_commands_exist(repo):
    """The profile's params file passes `rlhf params check`; every stage command is an `rlhf`
    command the app has, and no stage is the world."""
    from rlhf.cli.app import app
    from typer.testing import CliRunner

    profile = repo / "profiles" / "realdata"
    res = CliRunner().invoke(app, ["params", "check", "-p", str(profile / "params.yaml")])
    assert res.exit_code == 0, res.output
    stages = yaml.safe_load((profile / "dvc.yaml").read_text())["stages"]
    names = {c.name for c in app.registered_commands}
    assert "world" not in stages
    for name, st in stages.items():
        words = st["cmd"].split()
        assert words[0] == "rlhf" and words[1] in names, (name, words[:2])
