"""PPO wired into the pipeline: held-out prompts, stratified batches from the difficulty table,
the reward stage's scorer, and the SFT-vs-PPO gold evaluation (all on tiny models and tables)."""

from __future__ import annotations

import json
from collections import Counter

import ppo_tiny
import pyarrow as pa
import pytest
import torch
from rlhf.pipeline.config import build
from rlhf.pipeline.decode import Sampling
from rlhf.pipeline.heldout_prompts import held_out_prompts
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths
from rlhf.pipeline.samplers import StratifiedPromptSampler, load_prompts, strata
from rlhf.store.io import write_shard
from rlhf.store.schemas import schema_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _row(table: str, **given) -> dict:
    """A row of `table` with the given fields and neutral values for the others (so the fixture
    follows the schema wherever it lives)."""
    defaults = {pa.string(): "x", pa.int64(): 0, pa.int32(): 0, pa.float32(): 0.0}
    return {f.name: given.get(f.name, defaults.get(f.type)) for f in schema_for(table)
            if f.name != "prompt_key"}  # the store derives it from prompt_id


def _store(root, texts):
    """Pool: 12 prompts, clusters 0-11, topic = cluster % 3, split by cluster (ppo x8, eval x2,
    reward x2); `similar`: two members per cluster, one of an eval cluster repeats a training
    text (must be left out); difficulty: buckets low/mid/high by cluster."""
    splits = ["ppo"] * 8 + ["eval", "eval", "reward", "reward"]
    pool, similar, diff = [], [], []
    for c, (text, split) in enumerate(zip(texts, splits)):
        pid = f"p{c:02d}"
        pool.append(_row("pool", prompt_id=pid, text=text, dedup_cluster=c, cluster_size=3,
                         topic_cluster=c % 3, split=split))
        for k in range(2):
            member = f"{text} please" if k == 0 else f"so {text}"
            if c == 8 and k == 1:
                member = texts[0]  # an eval-cluster member that is also a ppo prompt: a leak
            similar.append(_row("similar", prompt_id=f"s{c:02d}{k}", text=member,
                                representative_id=pid, dedup_cluster=c, distance=0.1))
        diff.append(_row("difficulty", prompt_id=pid, bucket=("low", "mid", "high")[c % 4 % 3],
                         topic_cluster=c % 3, split=split, text=text))
    write_shard("pool", pool, root / "pool" / "part-00000.parquet")
    write_shard("similar", similar, root / "similar" / "part-00000.parquet")
    write_shard("difficulty", diff, root / "difficulty" / "part-00000.parquet")
    return root


def test_held_out_prompts_are_every_member_of_the_eval_clusters(tmp_path):
    store = _store(tmp_path, ppo_tiny.PROMPTS)
    held = held_out_prompts(store)
    assert [pid for pid, _ in held] == sorted(pid for pid, _ in held)
    assert {pid for pid, _ in held} == {"p08", "p09", "s080", "s090", "s091"}  # s081 leaks
    training = {t for _, t in load_prompts(store / "pool")}
    assert not training & {t for _, t in held}
    with pytest.raises(FileNotFoundError):
        held_out_prompts(tmp_path / "nowhere")


def test_stratified_batches_cover_buckets_and_topics_and_resume(tmp_path):
    store = _store(tmp_path, ppo_tiny.PROMPTS)
    prompts = load_prompts(store / "pool")  # split ppo: p00..p07
    rows = strata(store / "pool", store / "difficulty")
    sampler = StratifiedPromptSampler(prompts, rows, batch_size=4, seed=0)
    bucket = {r["prompt_id"]: r["bucket"] for r in rows}
    topic = {r["prompt_id"]: r["topic_cluster"] for r in rows}
    for _ in range(3):
        batch = sampler.next_batch(4)
        ids = [pid for pid, _ in batch]
        assert set(ids) <= {p for p, _ in prompts} and len(set(ids)) == 4
        assert {bucket[i] for i in ids} == {"low", "mid", "high"}
        assert {topic[i] for i in ids} == {0, 1, 2}
    state = json.loads(json.dumps(sampler.state_dict()))  # what the checkpoint stores
    expected = [sampler.next_batch(4) for _ in range(3)]
    again = StratifiedPromptSampler(prompts, rows, batch_size=4, seed=0)
    again.load_state_dict(state)
    assert [again.next_batch(4) for _ in range(3)] == expected
    with pytest.raises(ValueError, match="no row in the difficulty table"):
        StratifiedPromptSampler(prompts + [("new", "text")], rows, 4, 0)


def test_trainer_draws_stratified_batches_and_checkpoints_the_sampler(tmp_path):
    store = _store(tmp_path / "store", ppo_tiny.PROMPTS)
    prompts = load_prompts(store / "pool")
    tok = ppo_tiny.tokenizer()
    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "total_steps": 2}, "ppo")
    sampler = StratifiedPromptSampler(prompts, strata(store / "pool", store / "difficulty"),
                                      cfg.batch_size, cfg.seed)
    paths = RunPaths(tmp_path / "run", tmp_path / "rollouts", "strat")
    tr = PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, ppo_tiny.WordScorer(),
                    prompts, paths, sampler=sampler)
    tr.train()
    from rlhf.store.io import read_table

    rows = read_table("rollouts", tmp_path / "rollouts").to_pylist()
    per_step = Counter(r["step"] for r in rows)
    assert per_step == {1: 4, 2: 4}
    topic = {r["prompt_id"]: r["topic_cluster"] for r in strata(store / "pool",
                                                                  store / "difficulty")}
    for step in (1, 2):
        assert {topic[r["prompt_id"]] for r in rows if r["step"] == step} == {0, 1, 2}
    state = json.loads((tmp_path / "run" / "checkpoints" / "step-000002" /
                        "trainer_state.json").read_text())
    assert state["sampler"]["batches_drawn"] == 2 and "signature" in state["sampler"]


def test_reward_stage_scorer_and_gold_comparison(tmp_path):
    """The reward stage's scorer folder (scorer.json + checkpoint) under the trainer's interface,
    and `compare` scoring both policies on the same held-out prompts."""
    from rlhf.pipeline.models.scoring import RewardStageScorer, load_scorer
    from rlhf.pipeline.ppo.heldout_gold import compare
    from rlhf.pipeline.reward.scorer import save_scorer

    world = ppo_tiny.build_world(tmp_path / "world")
    save_scorer(world["reward"], ["."], [0.25], temperature=1.0, aggregation="mean",
                max_length=64)
    scorer = load_scorer(world["reward"])
    assert isinstance(scorer, RewardStageScorer) and scorer.name == "light_rm"
    prompts, responses = ["tell me about the cat", "describe the dog"], ["the cat is good", "bad"]
    rewards, conf = scorer.score(prompts, responses)
    assert torch.allclose(rewards, scorer.scorer(prompts, responses)[0])
    assert rewards.shape == conf.shape == (2,)
    per_token = scorer.token_scores(prompts, responses, [4, 1])
    assert [len(s) for _, s in per_token] == [4, 1]
    raw = scorer.scorer.member_rewards(prompts, responses)[0]  # score - reference, with eos
    assert all(abs(s[-1] - float(r)) < 1.0 for (_, s), r in zip(per_token, raw))

    store = _store(tmp_path / "store", ppo_tiny.PROMPTS)
    res = compare(world["policy"], world["policy"], store, Sampling(0.8, 0.95, 4), seed=0)
    assert res["n_prompts"] == res["sft"]["n"] == res["ppo"]["n"] == 5
    assert res["sft"] == res["ppo"] and res["gold_gain"] == 0.0  # same policy, same sampling
    assert res["sampling"] == {"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 4, "seed": 0,
                               "engine": "hf"}
    native = compare(world["policy"], world["policy"], store, Sampling(0.8, 0.95, 4), seed=0,
                     engine="native")
    assert native["sampling"]["engine"] == "native" and native["sft"] == native["ppo"]
