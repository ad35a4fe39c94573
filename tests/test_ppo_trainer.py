"""The PPO loop on a tiny Llama policy: logs, rollout rows, checkpoints, failure handling."""

from __future__ import annotations

import csv
import json
import math

import ppo_tiny
import pytest
import torch
from rlhf.pipeline.config import build
from rlhf.pipeline.decode import full_kl, token_entropy, token_logprobs
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.generate import rollout_dropout
from rlhf.pipeline.ppo.records import CSV_COLUMNS
from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths
from rlhf.pipeline.samplers import load_prompts
from rlhf.store.hashing import content_hash, response_key
from rlhf.store.io import read_table

SIX = ("rollout_success_rate", "reward_mean", "reward_std", "kl_div_mean", "clip_ratio",
       "critic_loss", "entropy_mean")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_trainer(tmp_path, scorer=None, checkpoint_table=None, **overrides):
    tok = ppo_tiny.tokenizer()
    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, **overrides}, "ppo")
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    paths = RunPaths(tmp_path / "run", tmp_path / "rollouts", "test-run", checkpoint_table)
    return PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok,
                      scorer or ppo_tiny.WordScorer(), prompts, paths)


def metrics(tmp_path):
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def events(tmp_path):
    path = tmp_path / "run" / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_adaptive_clip_reads_the_per_token_kl_when_asked(tmp_path):
    tr = make_trainer(tmp_path, total_steps=3, adaptive_clip_kl="token")
    tr.train()
    for x in metrics(tmp_path):
        kl = x["batch_kl"]
        assert x["clip_range"] == (0.1 if kl > 0.1 else 0.02 if kl < 0.02 else 0.1)
    assert metrics(tmp_path)[0]["clip_range"] == 0.02  # step 1: the policy is the reference


def test_loop_logs_records_and_checkpoints(tmp_path):
    tr = make_trainer(tmp_path, total_steps=4)
    before = {k: v.clone() for k, v in tr.acc.unwrap_model(tr.policy).state_dict().items()}
    tr.train()
    m = metrics(tmp_path)
    assert [x["step"] for x in m] == [1, 2, 3, 4]
    for x in m:
        assert all(math.isfinite(x[k]) for k in SIX)
        assert x["rollout_success_rate"] == 1.0
        assert x["gae_lambda"] == 0.92  # λ-ε table, first phase (seed 000 §3.3)
        # adaptive clip (seed 001 §5.2) on top of the table's ε = 0.1, from the batch's KL
        # per response (adaptive_clip_kl: sequence, the default)
        kl = x["kl_div_mean"]
        expected = 0.1 if kl > 0.1 else 0.02 if kl < 0.02 else 0.1
        assert x["clip_range"] == expected
    assert [x["kl_coef"] for x in m] == pytest.approx([0.0, 0.05 / 3, 0.1 / 3, 0.05])  # warm-up
    # seed 000 §4.4: a CSV line every `csv_every` (2) steps, exactly the six metrics
    with open(tmp_path / "run" / "metrics.csv") as fh:
        rows = list(csv.reader(fh))
    assert tuple(rows[0]) == CSV_COLUMNS and [r[0] for r in rows[1:]] == ["2", "4"]
    # TensorBoard got every metric at every step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    ea.Reload()
    for k in SIX:
        assert [e.step for e in ea.Scalars(f"ppo/{k}")] == [1, 2, 3, 4]
    # rollout rows: one per rollout, hashes not text (debug mode off)
    table = read_table("rollouts", tmp_path / "rollouts").to_pylist()
    assert len(table) == 4 * 4
    assert {(r["step"]) for r in table} == {1, 2, 3, 4}
    texts = dict((f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS))
    for r in table:
        assert r["prompt_hash"] == content_hash(texts[r["prompt_id"]])
        assert r["prompt_text"] is None and r["response_text"] is None
        assert r["checkpoint_id"] == f"test-run/policy-{r['step'] - 1:06d}"
        assert r["scorer"] == "word_rm" and 1 <= r["response_tokens"] <= 6
    ckpt = tmp_path / "run" / "checkpoints"
    assert (ckpt / "latest").read_text() == "step-000004"
    for name in ("policy.pt", "critic.pt", "optim.pt", "rng-rank0.pt", "trainer_state.json"):
        assert (ckpt / "step-000002" / name).exists()
    state = json.loads((ckpt / "step-000002" / "trainer_state.json").read_text())
    assert state["sampler"] == {"epoch": 0, "position": 8}
    after = tr.acc.unwrap_model(tr.policy).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    assert (tmp_path / "run" / "policy" / "config.json").exists()


def test_rollout_logprobs_and_kl_come_from_full_distributions(tmp_path):
    tr = make_trainer(tmp_path)
    r = tr.generate(tr.sampler.next_batch(4), "v0")
    tr.score(r)
    tr.forward_logprobs(r)
    logits = tr._logits(tr.acc.unwrap_model(tr.policy), r)
    ref_logits = tr._logits(tr.ref, r)
    assert logits.shape[-1] == len(tr.tokenizer)  # the whole vocabulary
    expected = token_logprobs(logits, r.response)
    assert torch.allclose(r.logprobs, expected, atol=1e-5)
    assert torch.allclose(r.kl, full_kl(logits, ref_logits) * r.response_mask, atol=1e-6)
    assert r.kl.abs().max() < 1e-5  # policy == reference before any update
    assert torch.allclose(r.entropy, token_entropy(logits), atol=1e-4)


def test_generation_timeout_falls_back_and_counts(tmp_path):
    tr = make_trainer(tmp_path, total_steps=1, generation_timeout_s=1e-9)
    before = {k: v.clone() for k, v in tr.acc.unwrap_model(tr.policy).state_dict().items()}
    tr.train()
    m = metrics(tmp_path)[0]
    assert m["rollout_success_rate"] == 0.0
    rows = read_table("rollouts", tmp_path / "rollouts").to_pylist()
    assert all("timeout" in r["flags"] and r["scorer"] == "fallback" for r in rows)
    assert any(e["event"] == "no_update" for e in events(tmp_path))
    after = tr.acc.unwrap_model(tr.policy).state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


class NaNScorer:
    name = "nan_rm"

    def score(self, prompts, responses):
        return torch.full((len(prompts),), float("nan")), torch.ones(len(prompts))


def test_nan_loss_skips_the_update_and_is_recorded(tmp_path):
    tr = make_trainer(tmp_path, scorer=NaNScorer(), total_steps=1, whiten_advantages=False)
    before = {k: v.clone() for k, v in tr.acc.unwrap_model(tr.policy).state_dict().items()}
    tr.train()
    m = metrics(tmp_path)[0]
    assert m["nan_skipped"] == 2.0  # both minibatches of the single epoch
    assert [e["count"] for e in events(tmp_path) if e["event"] == "nan_loss_skipped"] == [2]
    after = tr.acc.unwrap_model(tr.policy).state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


class CollapsingScorer:
    """Steady rewards, then in step 3 a collapse: mean 4.5 -> 0.5, std 0.5 -> 2.0."""

    name = "collapsing_rm"

    def __init__(self):
        self.calls = 0

    def score(self, prompts, responses):
        self.calls += 1
        n = len(prompts)
        if self.calls < 3:
            r = torch.tensor([4.0, 5.0] * (n // 2))
        else:
            r = torch.tensor([-1.5, 2.5] * (n // 2)) * 1.0
        return r, torch.ones(n)


def test_reward_collapse_raises_kl_coef_and_requests_rm_refresh(tmp_path):
    tr = make_trainer(tmp_path, scorer=CollapsingScorer(), total_steps=3, kl_warmup_on=False,
                      collapse_hold_steps=5)
    tr.train()
    m = metrics(tmp_path)
    assert [x["rm_refresh"] for x in m] == [0.0, 0.0, 1.0]
    assert [x["kl_coef"] for x in m] == [0.05, 0.05, 2.0]
    ev = [e for e in events(tmp_path) if e["event"] == "rm_refresh"]
    assert len(ev) == 1 and ev[0]["step"] == 3 and ev[0]["kl_coef"] == 2.0


def test_debug_rollouts_keep_text_and_plain_ppo_runs(tmp_path):
    tr = make_trainer(tmp_path, total_steps=1, debug_rollouts=True, lambda_eps_table_on=False,
                      adaptive_clip_on=False, kl_warmup_on=False, collapse_detector_on=False,
                      gradnorm_diagnostics_on=False, critic="full", kl_estimator="k3")
    tr.train()
    m = metrics(tmp_path)[0]
    assert (m["gae_lambda"], m["clip_range"], m["kl_coef"]) == (0.95, 0.2, 0.05)
    rows = read_table("rollouts", tmp_path / "rollouts").to_pylist()
    assert all(r["prompt_text"] in ppo_tiny.PROMPTS for r in rows)
    assert all(response_key(r["response_text"]) == r["response_key"] for r in rows)


def test_load_prompts_from_jsonl_and_pool(tmp_path):
    from rlhf.store.io import write_shard

    (tmp_path / "p.jsonl").write_text('{"text": "b"}\n{"prompt_id": "x", "text": "a"}\n')
    assert load_prompts(tmp_path / "p.jsonl") == [(content_hash("b"), "b"), ("x", "a")]
    rows = [dict(prompt_id=i, text=t, source_type="human", source_file="h.jsonl", source_line=1,
                 dedup_cluster=0, cluster_size=1,
                 topic_cluster=0, n_tokens=1, split=s)
            for i, t, s in (("1", "u", "ppo"), ("2", "v", "eval"))]
    write_shard("pool", rows, tmp_path / "pool" / "part-00000.parquet")
    assert load_prompts(tmp_path / "pool") == [("1", "u")]
    with pytest.raises(ValueError):
        load_prompts(tmp_path / "pool", split="reward")


def test_hf_scorer_token_scores_end_at_the_sequence_score(tmp_path):
    """Per-position RM attribution (critic.py): the prefix score after the last response token
    is the RM's score of the whole sample, read from the same forward pass."""
    from rlhf.pipeline.models.scoring import HFScorer
    from rlhf.pipeline.ppo.critic import reward_attention_weights

    world = ppo_tiny.build_world(tmp_path / "world")
    scorer = HFScorer.load(str(world["reward"]))
    prompts = ["tell me about the cat", "describe the dog"]
    responses = ["the cat is very good", "bad dog"]
    scores, conf = scorer.score(prompts, responses)
    ts = scorer.token_scores(prompts, responses, [5, 2])
    assert [len(s) for _, s in ts] == [5, 2]
    for (_, per_token), full in zip(ts, scores.tolist()):
        assert per_token[-1] == pytest.approx(full, abs=1e-5)
    assert conf.tolist() == [1.0, 1.0]
    # the weights the light critic gets for sample 0: 5 response tokens -> one high, one low
    p_score, s = ts[0]
    prefix = torch.tensor([[p_score] * 5 + s])
    w = reward_attention_weights(prefix, torch.tensor([[0] * 5 + [1] * 5]))
    assert sorted(w[0, 5:].tolist()) == pytest.approx([0.8, 1.0, 1.0, 1.0, 1.2])


def test_rollout_dropout_is_active_only_while_sampling(tmp_path):
    tr = make_trainer(tmp_path, rollout_dropout_on=True, rollout_dropout=0.5)
    model = tr.acc.unwrap_model(tr.policy)
    attn = [m for m in model.modules() if isinstance(getattr(m, "attention_dropout", None), float)]
    assert attn and all(m.attention_dropout == 0.0 for m in attn)
    with rollout_dropout(model, tr.cfg):
        assert model.training and all(m.attention_dropout == 0.5 for m in attn)
    assert not model.training and all(m.attention_dropout == 0.0 for m in attn)
    off = make_trainer(tmp_path / "off")
    m2 = off.acc.unwrap_model(off.policy)
    with rollout_dropout(m2, off.cfg):
        assert not m2.training  # default (seed 001 §5.2 is opt-in): plain eval-mode sampling


def test_policy_never_samples_the_pad_token(tmp_path):
    """A sampled pad would look like padding to the critic's mask check (seed 000 §5.3)."""
    tr = make_trainer(tmp_path, total_steps=1)
    model = tr.acc.unwrap_model(tr.policy)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-50.0)
        head.bias[tr.pad_id] = 100.0  # the policy wants nothing but pad ...
        head.bias[tr.eos_id] = 90.0  # ... and eos next
    model.lm_head = head
    tr.ref.lm_head = head
    r = tr.generate(tr.sampler.next_batch(4), "v0")
    assert not bool((r.response[r.response_mask] == tr.pad_id).any())
    assert r.response_lengths.tolist() == [1, 1, 1, 1]  # eos straight away, not a fallback
    assert bool(r.valid.all()) and r.response[:, 0].tolist() == [tr.eos_id] * 4
    tr.score(r)
    tr.forward_logprobs(r)
    tr.learner.values(r, tr.pad_id)  # the critic's mask assertion holds


def test_grad_norm_diagnosis_is_warned_once_and_logged_every_step(tmp_path):
    # shift -1 decade: from the second step on, every step counts as "moved up" relative to the
    # reference, whatever the norms (0 relied on step 3's peak not falling below step 1's, which
    # changed once prompts were rendered with pipeline/models/text.py)
    tr = make_trainer(tmp_path, total_steps=3, gradnorm_reference_steps=1,
                      gradnorm_shift_decades=-1.0)
    with pytest.warns(UserWarning, match="larger clip_range") as record:
        tr.train()
    assert len([w for w in record if "clip_range" in str(w.message)]) == 1
    ev = [e for e in events(tmp_path) if e["event"] == "grad_norm_diagnosis"]
    assert [e["step"] for e in ev] == [2, 3] and {e["suggestion"] for e in ev} == {"increase_clip"}
    assert all("grad_norm_peak_log10" in m for m in metrics(tmp_path))


def test_rollouts_and_checkpoints_land_in_the_store_and_survive_a_resume(tmp_path):
    """Rows go through store.rollouts (hive layout, whole-step shards cut at each checkpoint);
    each checkpoint is a `checkpoints` row the lineage audit walks; a resume from an older
    checkpoint redoes the later steps without storing any step twice."""
    from rlhf.cli.app import app
    from rlhf.store.rollouts import run_shards
    from typer.testing import CliRunner

    store = tmp_path / "store"
    tmp_path.joinpath("run").mkdir()
    tr = make_trainer(tmp_path, total_steps=4, checkpoint_table=store / "checkpoints")
    tr.paths.rollouts = store / "rollouts"
    tr.train()
    shards = run_shards(store / "rollouts", "test-run")
    assert [(a, b) for a, b, _ in shards] == [(1, 2), (3, 4)]  # flushed at each checkpoint
    assert all(p.parent.name == "step_bucket=0" for _, _, p in shards)
    ckpts = sorted(read_table("checkpoints", store / "checkpoints").to_pylist(),
                   key=lambda r: r["step"])
    assert [(c["checkpoint_id"], c["step"], c["parent_id"]) for c in ckpts] == [
        ("test-run/policy-000002", 2, None), ("test-run/policy-000004", 4, "test-run/policy-000002")]
    assert ckpts[0]["data_version"] == ckpts[1]["data_version"] == content_hash(
        "\n".join(sorted(f"p{i:02d}" for i in range(len(ppo_tiny.PROMPTS)))))
    assert all((tmp_path / "run" / "checkpoints" / f"step-{c['step']:06d}").samefile(c["path"])
               for c in ckpts)
    rows_before = sorted((r["step"], r["prompt_id"], r["response_key"])
                         for r in read_table("rollouts", store / "rollouts").to_pylist())

    def lineage(cid):
        res = CliRunner().invoke(app, ["audit", "lineage", cid, "--store", str(store),
                                       "--format", "jsonl"])
        assert res.exit_code == 0, res.output
        return [json.loads(x) for x in res.stdout.splitlines()]

    assert sum(r["rollouts"] for r in lineage("test-run/policy-000002")) == 2 * 4
    assert sum(r["rollouts"] for r in lineage("test-run/policy-000004")) == 4 * 4

    # as if killed after step 4's rows and checkpoint row but before `latest` moved on
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step-000002")
    again = make_trainer(tmp_path, total_steps=4, checkpoint_table=store / "checkpoints")
    again.paths.rollouts = store / "rollouts"
    again.train(resume=True)
    rows = sorted((r["step"], r["prompt_id"], r["response_key"])
                  for r in read_table("rollouts", store / "rollouts").to_pylist())
    assert rows == rows_before  # steps 3-4 redone exactly, stored once
    ckpts = read_table("checkpoints", store / "checkpoints").to_pylist()
    assert sorted((c["checkpoint_id"], c["parent_id"]) for c in ckpts) == [
        ("test-run/policy-000002", None), ("test-run/policy-000004", "test-run/policy-000002")]
