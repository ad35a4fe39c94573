"""The stages' worker processes (pipeline/workers.py): how many $RLHF_WORKERS grants, and a job
a spawned worker runs returns the bytes the stage's own process gets: the reward stage's
distillation rollouts, drawn in a worker while the strong members train, equal the inline ones
(every response and log-prob), a worker renders prompts in the stage's text.prompt_format, and a
worker (one core of the stage's) starts no workers or scoring threads of its own."""

from __future__ import annotations

import ppo_tiny
import pytest


def test_workers_come_from_the_environment(monkeypatch):
    from rlhf.pipeline.workers import worker_count

    monkeypatch.delenv("RLHF_WORKERS", raising=False)
    assert worker_count(3) == 1  # unset: inline (the test suite: its workers share the cores)
    monkeypatch.setenv("RLHF_WORKERS", "0")  # make run: one per core
    assert 1 <= worker_count(3) <= 3 and worker_count(1) == 1
    monkeypatch.setenv("RLHF_WORKERS", "5")
    assert worker_count(3) == 3 and worker_count(0) == 1
    monkeypatch.setenv("RLHF_WORKERS", "two")
    with pytest.raises(ValueError, match="RLHF_WORKERS must be a whole number"):
        worker_count(3)


@pytest.mark.slow  # spawned workers: a torch import each
@pytest.mark.usefixtures("one_torch_thread")  # as a stage (quiet_hf) and its workers run
def test_rollouts_drawn_in_a_worker_equal_the_inline_ones(tmp_path, monkeypatch):
    from rlhf.pipeline.models.text import prompt_format, use_prompt_format
    from rlhf.pipeline.reward.distill import sft_rollouts
    from rlhf.pipeline.reward.stage import RewardConfig
    from rlhf.pipeline.workers import worker_count, worker_pool

    policy = ppo_tiny.build_world(tmp_path)["policy"]
    cfg = RewardConfig(rollout_k=3, max_new_tokens=8, batch_size=6, engine="native")
    prompts = ppo_tiny.PROMPTS[:5]  # 2 prompts per batch: 3 batches, each its own seed
    monkeypatch.setenv("RLHF_WORKERS", "2")
    previous = use_prompt_format("plain")
    try:
        inline = sft_rollouts(cfg, policy, prompts)
        with worker_pool(2) as pool:
            assert pool is not None
            fmt = pool.submit(prompt_format)
            nested = pool.submit(worker_count, 3)  # its environment says 2, as the stage's does
            drawn = pool.submit(sft_rollouts, cfg, policy, prompts)
            assert fmt.result() == "plain"  # the stage's format, not a fresh process's "auto"
            assert nested.result() == 1
            drawn = drawn.result()
    finally:
        use_prompt_format(previous)
    assert [len(ss) for ss in drawn] == [3] * 5
    assert drawn == inline  # Sample: the response, its token count and every log-prob
