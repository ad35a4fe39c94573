"""The preferences stage on human labels only (preferences.labels: human, the realdata profile):
real ingest, real parquet tables, the real CLI. Bad labels land in `rejected_labels` with a
reason code (input = kept + rejected per source); bad invocations are one error line."""

from __future__ import annotations

import json

import pytest
from params_file import write_params

HH = "\n\nHuman: {q}\n\nAssistant: {a}"


def _sources(root):
    src = root / "sources"
    src.mkdir(parents=True)
    hh = [{"chosen": HH.format(q=f"How do I care for plant number {i}?", a=f"Water plant {i} weekly."),
           "rejected": HH.format(q=f"How do I care for plant number {i}?", a="No idea.")}
          for i in range(12)]
    # the same reply on both sides: no preference at all
    hh.append({"chosen": HH.format(q="Is the sky blue?", a="Yes, it is."),
               "rejected": HH.format(q="Is the sky blue?", a="Yes, it is.")})
    (src / "hh.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hh))
    rows = [
        {"text": "Explain tides simply.", "source_type": "human", "writer_id": "w1",
         "written_at": "2026-01-02"},
        # a human prompt without its writer: quarantined by ingest (missing_provenance)
        {"text": "Explain eclipses simply.", "source_type": "human", "written_at": "2026-01-02"},
    ]
    (src / "team.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return src


def _queue(path):
    lines = [
        {"prompt": "Explain tides simply.", "chosen": "The moon pulls the sea.",
         "rejected": "Water.", "annotator_id": "alice", "labeled_at": "2026-02-01T10:00:00Z"},
        {"prompt": "Explain tides simply.", "responses": ["The moon's pull.", "Wind.", "Fish."],
         "annotator_id": "bob", "labeled_at": "2026-02-01T11:00:00Z"},
        # a prompt the store does not hold (never ingested, or quarantined by ingest)
        {"prompt": "Explain eclipses simply.", "chosen": "The moon blocks the sun.",
         "rejected": "Magic.", "annotator_id": "alice", "labeled_at": "2026-02-02T10:00:00Z"},
        # equal texts: no preference
        {"prompt": "Explain tides simply.", "chosen": "Same.", "rejected": " Same. ",
         "annotator_id": "bob", "labeled_at": "2026-02-02T11:00:00Z"},
        # no annotator: a label without its provenance
        {"prompt": "Explain tides simply.", "chosen": "A", "rejected": "B",
         "labeled_at": "2026-02-02T12:00:00Z"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + "{not json\n")
    return path


def _invoke(*args):
    from rlhf.cli.app import app
    from typer.testing import CliRunner

    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def store(tmp_path):
    from rlhf.pipeline.ingest import IngestConfig, run_ingest

    run_ingest([_sources(tmp_path)], tmp_path / "store", IngestConfig())
    return tmp_path / "store"


def test_bad_labels_are_quarantined_with_reasons(store, tmp_path):
    from rlhf.store.io import read_table

    params = write_params(tmp_path / "params.yaml", preferences={
        "labels": "human", "gold_fraction": 0.3, "heldout_fraction": 0.2})
    queue = _queue(tmp_path / "queue.jsonl")
    out, rej, metrics = store / "preferences", store / "rejected_labels", tmp_path / "m.json"
    res = _invoke("preferences", "--labels-from", store, "--queue", queue,
                  "--queue", tmp_path / "absent.jsonl", "--out", out, "--rejected-out", rej,
                  "--params", params, "--report", metrics, "--metrics", tmp_path / "h.json")
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output and "absent" in res.output
    # ingest: the prompt without its writer is in the quarantine, not in prompts
    ingest_rej = read_table("rejected", store / "rejected").to_pylist()
    assert [r["reasons"] for r in ingest_rej] == [["missing_provenance"]]
    bad = read_table("rejected_labels", rej).to_pylist()
    by_line = {(r["source_type"], r["source_line"]): r["reasons"] for r in bad}
    assert by_line == {("hh-rlhf", 13): ["equal_responses"], ("queue", 3): ["unknown_prompt"],
                       ("queue", 4): ["equal_responses"], ("queue", 5): ["missing_provenance"],
                       ("queue", 6): ["bad_json"]}
    m = json.loads(metrics.read_text())
    assert m["labels_by_source"] == {"hh-rlhf": {"input": 13, "kept": 12, "rejected": 1},
                                     "queue": {"input": 6, "kept": 2, "rejected": 4}}
    assert m["invariant_holds"] and m["rejected_by_reason"]["equal_responses"] == 2
    headline = json.loads((tmp_path / "h.json").read_text())  # what `dvc metrics show` lists
    assert headline["n_pairs_gold"] == m["n_pairs_gold"] and headline["invariant_holds"]
    rows = read_table("preferences", out).to_pylist()
    # 12 hh pairs + the queue's pair + its 3-way ranking
    assert len({r["ranking_id"] for r in rows}) == 14 and len(rows) == 12 * 2 + 2 + 3
    assert {r["source"] for r in rows} == {"hh-rlhf", "queue"}
    bob = [r for r in rows if r["annotator_id"] == "bob"]
    assert [r["rank"] for r in sorted(bob, key=lambda r: r["rank"])] == [0, 1, 2]
    assert bob[0]["labeled_at"].year == 2026
    # the splits are by prompt: a prompt's labels are all on one side; gold is there
    split_of = {}
    for r in rows:
        assert split_of.setdefault(r["prompt_id"], r["split"]) == r["split"]
    assert set(split_of.values()) <= {"train", "heldout", "gold"} and "gold" in split_of.values()


def test_reward_trains_only_on_train_split_of_human_sources(store, tmp_path):
    """The proxy RMs read `train` (and `heldout` to calibrate), never `gold`; the held-out gold RM
    reads only `gold` (pipeline/models/judges.train_heldout_judge)."""
    from rlhf.pipeline.preferences import PreferencesConfig, expand_pairs, run_human
    from rlhf.store.io import read_table

    cfg = PreferencesConfig(labels="human", gold_fraction=0.3, heldout_fraction=0.2)
    run_human(cfg, store, tmp_path / "prefs", tmp_path / "rej")
    pairs = expand_pairs(read_table("preferences", tmp_path / "prefs").to_pylist())
    gold = {p["prompt_id"] for p in pairs if p["split"] == "gold"}
    proxy = {p["prompt_id"] for p in pairs if p["split"] in ("train", "heldout")}
    assert gold and proxy and not gold & proxy


def test_clear_errors_not_tracebacks(store, tmp_path):
    params = write_params(tmp_path / "params.yaml", preferences={"labels": "human"})
    res = _invoke("preferences", "--labels-from", tmp_path / "nowhere", "--out", tmp_path / "o",
                  "--rejected-out", tmp_path / "r", "--params", params)
    assert res.exit_code == 2 and "--labels-from" in res.output and "Traceback" not in res.output
    res = _invoke("preferences", "--out", tmp_path / "o", "--params", params)
    assert res.exit_code == 2 and "--labels-from" in res.output
    # a store with prompts but no human labels at all: one error line
    empty = tmp_path / "empty_store"
    from rlhf.pipeline.ingest import IngestConfig, run_ingest

    src = tmp_path / "only_prompts.jsonl"
    src.write_text(json.dumps({"text": "Hi?", "source_type": "human", "writer_id": "w",
                               "written_at": "2026-01-01"}) + "\n")
    run_ingest([src], empty, IngestConfig())
    res = _invoke("preferences", "--labels-from", empty, "--out", tmp_path / "o",
                  "--rejected-out", tmp_path / "r", "--params", params)
    assert res.exit_code == 2 and "no usable human preference labels" in res.output
    write_params(params, preferences={"labels": "humans"})
    res = _invoke("preferences", "--labels-from", store, "--out", tmp_path / "o",
                  "--rejected-out", tmp_path / "r", "--params", params)
    assert res.exit_code == 2 and "labels must be" in res.output
