"""The PPO trainer on the native engine (tests/ppo_tiny.py's world): it trains, the old-log-prob
pass is skipped every step and the reference pass kept, and the timeout still falls back."""

from __future__ import annotations

import json
import math

import pytest
from rlhf.store.io import read_table
from test_ppo_trainer import make_trainer, metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("draft", ["none", "lookup", "model"])
def test_native_engine_trains_and_skips_the_old_logprob_pass(tmp_path, draft):
    tr = make_trainer(tmp_path, total_steps=2, engine="native", draft=draft)
    tr.train()
    m = metrics(tmp_path)
    assert [x["step"] for x in m] == [1, 2]
    for x in m:
        assert math.isfinite(x["kl_div_mean"]) and math.isfinite(x["critic_loss"])
        assert x["logprob_passes_saved"] == 1 and x["logprob_token_forwards"] == 0
        assert x["ref_token_forwards"] > 0 and x["gen_token_forwards"] > 0
    if draft != "none":
        assert sum(x["drafted_tokens"] for x in m) > 0
    # the rollout rows carry their drafts: per step they add up to the metrics' counts
    rows = read_table("rollouts", tmp_path / "rollouts").to_pylist()
    for x in m:
        mine = [r for r in rows if r["step"] == x["step"]]
        assert len(mine) == x["rollouts_started"]
        assert sum(r["drafted"] for r in mine) == x["drafted_tokens"]
        assert sum(r["accepted"] for r in mine) == x["accepted_tokens"]
        assert all(0 <= r["accepted"] <= r["drafted"] for r in mine)
        if draft == "none":
            assert all(r["drafted"] == 0 for r in mine)
    if draft == "model":  # the draft model's own forwards are counted apart
        assert all(x["draft_forwards"] > 0 and x["draft_token_forwards"] > 0 for x in m)


def test_auto_engine_on_a_cpu_trains_as_native_and_records_native(tmp_path):
    tr = make_trainer(tmp_path, total_steps=1, engine="auto")
    assert tr.cfg.engine == "native" and tr.context.cfg.engine == "native"
    tr.train()
    m = metrics(tmp_path)[0]
    assert m["logprob_passes_saved"] == 1  # native's sampled log-probs replaced the pass
    states = sorted(tmp_path.rglob("trainer_state.json"))
    assert states and all(json.loads(p.read_text())["config"]["engine"] == "native"
                          for p in states)


def test_native_engine_timeout_falls_back_and_keeps_the_pass(tmp_path):
    tr = make_trainer(tmp_path, total_steps=1, engine="native", generation_timeout_s=1e-9)
    tr.train()
    m = metrics(tmp_path)[0]
    assert m["rollout_success_rate"] == 0.0
    assert m["logprob_passes_saved"] == 0  # fallback rows were never sampled
    assert json.dumps(m)


def test_reuse_drafts_a_prompts_stored_response_and_checkpoints_the_store(tmp_path):
    """ppo.draft reuse (SPEC-RL, an arm): a prompt's previous response is drafted when the prompt
    comes back (12 prompts, 4 a step: from step 4), the store is the drafts hook's checkpointed
    state, and a restored trainer holds the same store."""
    from rlhf.pipeline.ppo import checkpoint

    kw = {"total_steps": 4, "engine": "native", "draft": "reuse", "checkpoint_every": 2}
    tr = make_trainer(tmp_path, **kw)
    tr.train()
    m = metrics(tmp_path)
    assert [x["drafted_tokens"] > 0 for x in m] == [False, False, False, True]
    assert 0 < m[3]["accepted_tokens"] <= m[3]["drafted_tokens"]
    # per row: the step-4 rows whose prompt came back drafted its old response and kept some
    rows = [r for r in read_table("rollouts", tmp_path / "rollouts").to_pylist()
            if r["step"] == 4]
    assert sum(r["drafted"] for r in rows) == m[3]["drafted_tokens"]
    assert sum(r["accepted"] for r in rows) == m[3]["accepted_tokens"]
    assert all(0 <= r["accepted"] <= r["drafted"] for r in rows)
    state = json.loads((tmp_path / "run" / "checkpoints" / "step-000004" /
                        "trainer_state.json").read_text())
    store = state["hooks"]["drafts"]["store"]
    assert len(store) == 12 and all(len(t) == len(lp) > 0 for v in store.values() for t, lp in v)
    again = make_trainer(tmp_path, **kw)
    checkpoint.load(again)
    assert again.hooks.generation[0].drafter.store == tr.hooks.generation[0].drafter.store
