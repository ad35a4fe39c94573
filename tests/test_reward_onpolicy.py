"""On-policy RM figures (pipeline/reward/onpolicy.py): within-prompt Spearman on hand-made
scores, and the sample set drawn from a real tiny policy at given sampling settings."""

import math

import pytest

from rlhf.pipeline.reward.onpolicy import onpolicy_report, onpolicy_set, within_prompt_spearman


def test_within_prompt_spearman_ignores_the_between_prompt_offset():
    gold = [1, 2, 3, 1, 2, 3]
    # prompt 2's RM scores are shifted far up: overall order is wrong, within each prompt right
    scores = [0.1, 0.2, 0.3, 10.1, 10.2, 10.3]
    rho, n = within_prompt_spearman(scores, gold, [[0, 1, 2], [3, 4, 5]])
    assert (rho, n) == (pytest.approx(1.0), 2)
    rho, _ = within_prompt_spearman([3, 2, 1, 1, 2, 3], gold, [[0, 1, 2], [3, 4, 5]])
    assert rho == pytest.approx(0.0)  # -1 and +1


def test_prompts_without_a_ranking_are_skipped_and_counted():
    gold = [1, 1, 1, 1, 2, 3, 0, 5]
    scores = [1, 2, 3, 5, 5, 5, 1, 2]
    groups = [[0, 1, 2], [3, 4, 5], [6, 7]]  # constant gold, constant RM, too small
    rho, n = within_prompt_spearman(scores, gold, groups)
    assert n == 0 and math.isnan(rho)


def test_onpolicy_set_samples_k_per_prompt_and_scores_gold():
    import ppo_tiny

    tok = ppo_tiny.tokenizer()
    calls = []

    def judge(p, r):
        calls.append((p, r))
        return float(len(r.split()))

    data = onpolicy_set(ppo_tiny.policy(tok), tok, ppo_tiny.PROMPTS[:3], 4, 0.8, 0.95, 5, 0, 8,
                        judge)
    assert len(data) == 12 and [len(g) for g in data.groups] == [4, 4, 4]
    assert data.prompts[4:8] == [ppo_tiny.PROMPTS[1]] * 4 and len(calls) == 12
    rep = onpolicy_report([float(len(r)) for r in data.responses], data)
    assert set(rep) == {"spearman", "spearman_within_prompt", "prompts_ranked", "n"}
    assert rep["n"] == 12
