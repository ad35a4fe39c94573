"""Sampling settings and the exact draw: `Sampling` (temperature, top-p, max new tokens), one
value every stage samples with, and `top_p_sample`, top-p filtering and one draw per row that
orders only the nucleus' edge (the native engine's; tests/test_fast_decode.py checks it against
the warper).

    python -c "from rlhf.pipeline.decode import Sampling; print(Sampling(0.8, 0.95, 48))"
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EDGE_MARGIN = 1e-6  # top_p_sample removes a bucket unordered only this far below 1 - top_p


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # <= 0: greedy
    top_p: float = 1.0
    max_new_tokens: int = 48

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def top_p_sample(scores: torch.Tensor, top_p: float):
    """Top-p filtering and one sample per row: (`TopPLogitsWarper(top_p)(ids, scores)`, the
    sampled token of each row).

    Why not the warper: it sorts the whole vocabulary each step, and `torch.multinomial` draws
    over all of it; on a CPU that cost a decode step about as much as its forward. Here only the
    tokens that can sit at the nucleus' edge are ordered. The warper removes the ascending-order
    prefix whose cumulative probability is <= 1 - top_p (the most likely token always stays); a
    token's cumulative probability is the mass of it and of every less likely token. Bucketing
    the probabilities by their float32 exponent (one histogram of mass per row, in double) bounds
    every token's cumulative probability by the mass of its bucket and all lower ones, so the
    buckets whose bound is below 1 - top_p (less `EDGE_MARGIN`) are removed without ordering.
    The rest, the candidates, are ordered by row and descending probability (one sort of their
    float bits, which order like the values), and each keeps the warper's rule on its own
    cumulative probability: the row's total minus the mass strictly above it, summed in double
    (as torch's CPU cumsum accumulates) and compared in float32 (as the warper compares). Kept
    scores are the input's own values, the rest -inf.

    The token is drawn by inverse CDF over the kept tokens (a prefix of each row's candidates):
    one uniform u per row, the first kept token whose running mass exceeds u times the kept
    mass, i.e. token i with probability p_i / sum_kept p, as `torch.multinomial` would draw it
    from the filtered scores (other random draws, the same distribution). Exactness:
    tests/test_fast_decode.py (the warper's nucleus; chi-square against its distribution, which
    sampling the unfiltered distribution or a skewed uniform fails)."""
    probs = scores.softmax(-1)
    if top_p >= 1.0:
        return scores, torch.multinomial(probs, 1).squeeze(1)
    if probs.dtype != torch.float32:
        raise TypeError(f"top_p_sample takes float32 scores (the engine's), not {probs.dtype}")
    R, V = probs.shape
    dev = scores.device
    bound = torch.tensor(1 - top_p, dtype=probs.dtype)
    bits = probs.view(torch.int32)             # ordered like the values (p >= 0)
    bucket = bits >> 23                         # the exponent field: 0..127 for p <= 1
    rows = torch.arange(0, R * 128, 128, device=dev, dtype=torch.int32)[:, None]
    mass = torch.bincount((bucket + rows).view(-1), weights=probs.view(-1).double(),
                          minlength=R * 128).view(R, 128)
    upto = mass.cumsum(-1)                      # mass of bucket j and every lower one
    total = upto[:, -1]
    first = (upto < float(bound) * (1 - EDGE_MARGIN)).sum(-1)  # lower buckets: surely removed
    top = ((mass > 0) * torch.arange(128, device=dev)).amax(-1)
    first = torch.minimum(first, top).to(torch.int32)       # the most likely token's bucket
    flat = (bucket >= first[:, None]).view(-1).nonzero().squeeze(1)  # candidates, flat index
    key = ((flat // V) << 31) | (0x7FFFFFFF - bits.view(-1).index_select(0, flat).long())
    flat = flat.index_select(0, torch.sort(key).indices)    # by row, descending p
    r = flat // V
    vd = probs.view(-1).index_select(0, flat).double()
    cs = vd.cumsum(0)                                       # running over all rows' candidates
    excl = torch.cat([cs.new_zeros(1), cs[:-1]])
    counts = torch.bincount(r, minlength=R)
    starts = counts.cumsum(0) - counts
    base = excl.index_select(0, starts)                     # the mass before each row's run
    above = excl - base.index_select(0, r)                  # mass strictly above, in its row
    keep = (total.index_select(0, r) - above).to(probs.dtype) > bound
    keep[starts] = True                                     # the most likely token stays
    kept = flat[keep]
    out = torch.full_like(scores, -float("inf"))
    out.view(-1).index_copy_(0, kept, scores.reshape(-1).index_select(0, kept))
    last = starts + torch.bincount(r[keep], minlength=R) - 1
    u = torch.rand(R, dtype=torch.double, device=dev)
    at = torch.searchsorted(cs, base + u * (cs.index_select(0, last) - base), right=True)
    at = torch.maximum(torch.minimum(at, last), starts)
    return out, flat.index_select(0, at) % V
