"""Sampling inside the static decode step (pipeline/decode/static.py): one function of fixed
shapes and no host sync, so that it runs inside a captured CUDA graph.

What it computes is the native engine's (pipeline/decode/native.py), in model.generate's order: the pad
token suppressed, the caller's processors (outside, between the forward and this), temperature
(`TemperatureLogitsWarper`), top-p (`TopPLogitsWarper` itself: it sorts the whole row, which is
shape-static, where the native engine's CPU `top_p_sample` orders only the nucleus' edge through
data-dependent shapes), then one draw. The draw is the exponential race: token
argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. is token i with probability p_i / sum p, the
distribution `torch.multinomial` draws from (other random numbers, no sync, no data-dependent
shape). tests/test_decode_static.py checks the drawn distribution against the warper's nucleus
by a chi-square test that a wrong variant (`edge_dropped=True`) fails.

On a CPU the step runs eager (no graph needs fixed shapes), and there `warp_draw` samples with
the native engine's `top_p_sample` instead: the same nucleus and distribution, ordering only the
nucleus' edge. The warper's full sort and the race's exponentials were a third of a CPU step
(torch.profiler, batch 16: docs/engine.md).

    python -c "from rlhf.pipeline.decode import StepSampling; help(StepSampling)"
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rlhf.pipeline.decode.sampling import top_p_sample

TINY = torch.finfo(torch.float32).tiny  # an Exp(1) draw of 0 would make 0 / 0 in the race


@dataclass(frozen=True)
class StepSampling:
    """The sampling settings the step needs, fixed for one generation."""

    greedy: bool
    temperature: float
    top_p: float
    pad: int | None       # suppressed (never sampled) unless None
    eos: int | None
    fill: int             # the token a stopped row gets

    @classmethod
    def of(cls, sampling, tokenizer, suppress_pad: bool = True) -> StepSampling:
        pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        fill = pad if pad is not None else (eos if eos is not None else 0)
        return cls(sampling.greedy, 1.0 if sampling.greedy else sampling.temperature,
                   sampling.top_p, pad if suppress_pad and pad is not None and pad != eos else None,
                   eos, fill)


def suppress(raw: torch.Tensor, s: StepSampling) -> torch.Tensor:
    """[S, V] float32 scores with the pad token suppressed (what the processors see)."""
    scores = raw.float().clone()
    if s.pad is not None:
        scores[:, s.pad] = -float("inf")  # a python index: no host-to-device copy in a graph
    return scores


def warp(scores: torch.Tensor, s: StepSampling, edge_dropped: bool = False) -> torch.Tensor:
    """Temperature, then the warper's top-p nucleus (masked scores, -inf outside).

    `edge_dropped` is a deliberately wrong nucleus (the token that crosses top_p left out), for
    the test that shows the chi-square test can tell."""
    if s.greedy:
        return scores
    scores = scores / s.temperature
    if s.top_p >= 1.0:
        return scores
    if not edge_dropped:  # the warper itself: sort, softmax, cumsum, scatter, all shape-static
        from transformers import TopPLogitsWarper

        return TopPLogitsWarper(s.top_p)(None, scores)
    ordered, idx = torch.sort(scores, descending=True)
    before = ordered.softmax(-1).cumsum(-1)
    drop = before >= s.top_p
    drop[..., 0] = False
    return scores.masked_fill(drop.scatter(1, idx, drop), -float("inf"))


def draw(scores: torch.Tensor, s: StepSampling) -> torch.Tensor:
    """[S] one token a row: argmax (greedy) or the exponential race over softmax(scores)."""
    if s.greedy:
        return scores.argmax(-1)
    probs = scores.softmax(-1)
    race = torch.empty_like(probs).exponential_(1).clamp_min_(TINY)
    return (probs / race).argmax(-1)


def warp_draw(scores: torch.Tensor, s: StepSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """(the warped scores, one token a row): `warp` then `draw` where the step may be captured
    (CUDA) or is greedy; on a CPU, temperature then `top_p_sample` (inverse CDF over the nucleus,
    the same distribution, data-dependent shapes and one sync, which an eager step can afford)."""
    if s.greedy or scores.device.type != "cpu":
        warped = warp(scores, s)
        return warped, draw(warped, s)
    return top_p_sample(scores / s.temperature, s.top_p)


def sample_step(raw: torch.Tensor, scores: torch.Tensor, done: torch.Tensor, s: StepSampling):
    """One step's draw and accounting for the S slots of a bucket.

    `raw` [S, V] the logits, `scores` [S, V] after pad suppression and the processors, `done`
    [S] bool the slots whose row had stopped before this step. Returns (token, log-prob under
    the sampled distribution, log-prob and entropy under the trainer's definition (full
    softmax of raw / temperature), done after this token); a stopped slot gets `fill` and 0s."""
    warped, tok = warp_draw(scores, s)
    lp_sampled = torch.log_softmax(warped, -1).gather(1, tok[:, None]).squeeze(1)
    logp = torch.log_softmax(raw.float() / (s.temperature + 1e-7), -1)
    lp_full = logp.gather(1, tok[:, None]).squeeze(1)
    ent = -(logp.exp() * logp).nansum(-1)
    zero = torch.zeros_like(lp_full)
    tok = torch.where(done, torch.full_like(tok, s.fill), tok)
    now = done | (tok == s.eos) if s.eos is not None else done
    return (tok, torch.where(done, zero, lp_sampled), torch.where(done, zero, lp_full),
            torch.where(done, zero, ent), now)
