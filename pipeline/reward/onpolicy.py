"""How well a reward model ranks what PPO will actually show it: the SFT policy's own samples of
ppo-split prompts, drawn at PPO's sampling settings, against the gold judge.

An RM that only tells demonstrations from policy samples gives PPO nothing to climb: PPO's
advantages compare samples of one policy, mostly samples of the same prompt against the critic's
baseline. So the reward stage reports, as headline figures, each RM's Spearman against gold on
this distribution, over all samples and within a prompt (the mean over prompts of the Spearman
among that prompt's samples; prompts whose samples all share one gold score or one RM score are
left out, and counted).

    python -c "from rlhf.pipeline.reward.onpolicy import within_prompt_spearman; \
print(within_prompt_spearman([1, 2, 3, 3, 2, 1], [1, 2, 3, 1, 2, 3], [[0, 1, 2], [3, 4, 5]]))"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class OnPolicySet:
    prompts: list[str]        # [N] one entry per sample
    responses: list[str]      # [N]
    gold: list[float]         # [N] the gold judge's score
    groups: list[list[int]]   # per prompt: the indices of its samples

    def __len__(self) -> int:
        return len(self.responses)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho; NaN with fewer than 3 points or a constant side (no order to compare)."""
    from scipy.stats import spearmanr

    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return float("nan")
    rho = spearmanr(a, b).statistic
    return float(rho) if rho == rho else float("nan")


def within_prompt_spearman(scores: Sequence[float], gold: Sequence[float],
                           groups: Sequence[Sequence[int]]) -> tuple[float, int]:
    """(mean per-prompt Spearman, prompts counted): prompts with < 3 samples, or where gold
    or the RM gives every sample the same score, have no ranking to get right and are skipped."""
    rhos = []
    for g in groups:
        rho = spearman([float(scores[i]) for i in g], [float(gold[i]) for i in g])
        if rho == rho:
            rhos.append(rho)
    return (sum(rhos) / len(rhos) if rhos else float("nan")), len(rhos)


def onpolicy_set(policy, tokenizer, prompts: Sequence[str], k: int, temperature: float,
                 top_p: float, max_new_tokens: int, seed: int, batch_size: int,
                 judge: Callable[[str, str], float] | None = None,
                 engine: str = "hf") -> OnPolicySet:
    """`k` samples per prompt from `policy` at these sampling settings (through rollout
    engine `engine`), gold-scored."""
    from rlhf.pipeline.models.policy import sample

    if judge is None:
        from rlhf.pipeline.world.judge import gold_score as judge
    outs = sample(policy, tokenizer, list(prompts), n=k, max_new_tokens=max_new_tokens,
                  temperature=temperature, top_p=top_p, seed=seed, batch_size=batch_size,
                  engine=engine)
    ps, rs, groups = [], [], []
    for p, ss in zip(prompts, outs):
        groups.append(list(range(len(rs), len(rs) + len(ss))))
        ps += [p] * len(ss)
        rs += [s.response for s in ss]
    from rlhf.pipeline.models.judges import score_all

    return OnPolicySet(ps, rs, score_all(judge, ps, rs), groups)


def onpolicy_report(scores: Sequence[float], data: OnPolicySet) -> dict:
    """{spearman, spearman_within_prompt, prompts_ranked, n} of one RM's scores of `data`."""
    within, n_groups = within_prompt_spearman(scores, data.gold, data.groups)
    return {"spearman": spearman([float(s) for s in scores], data.gold),
            "spearman_within_prompt": within, "prompts_ranked": n_groups, "n": len(data)}
