"""Drafted decoding for the native engine: a drafter proposes up to k next tokens per row, the
policy scores them all in **one** forward, and an accept rule keeps a prefix of them.

Drafters (`get_drafter(name)`):
- `lookup`: the last n tokens of a row (n = 3, 2, 1) matched against the row's own context
  (prompt and response so far) and the recent responses it has seen; the tokens that followed
  the latest match are the draft, a point mass.
- `reuse`: the prompt's previous response and its stored log-probs (SPEC-RL's sample reuse).
  An arm, NOT exact (see below).
- `model`: the policy's own first layers draft k tokens from a distribution q known at
  verification (pipeline/draft_model.py, whose docstring proves the rule it is verified with
  exact: accept with min(1, p/q), residual max(0, p - q)).

The point-mass rule (exact). At a position whose target distribution is p (the policy's, after
temperature and top-p) and whose draft is the token x: draw a fresh u ~ U(0, 1); accept x if
u < p(x); otherwise draw y from p with x removed, renormalised. Then for every token y
    P(y) = [y = x] p(x) + (1 - p(x)) [y != x] p(y) / (1 - p(x)) = p(y),
whatever x was, as long as u is independent of how x was chosen (the drafter sees only the
context). The cache after a verification holds exactly the accepted prefix (the rejected
draft slots stay in the cache with attention mask 0, and positions count accepted tokens only),
so the next position's p is the policy's given the true prefix; by induction over positions
the joint distribution of a response is the policy's autoregressive one. When every draft is
accepted the forward's last position gives p for one further token, sampled from p directly.

The reuse rule (SPEC-RL, arXiv 2509.23232): accept the old token x with probability
min(1, l p(x) / q_old(x)), q_old its stored log-prob, l = e^0.5; at the first rejection the row
samples afresh from p. P(y) is then min(1, l p(x)/q_old(x)) at y = x plus the rejection mass
times p(y), which is not p(y) in general (no residual, and the lenience l): when the policy has
not moved (p = q_old) the old token comes back with probability 1. tests/test_drafts.py
shows this rule failing the exactness test that the point-mass rule passes.

    python -c "from rlhf.pipeline.drafters import get_drafter; print(get_drafter('lookup').name)"
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from rlhf.pipeline.generation import Generated, Sampling, prefill

DRAFTS = ("none", "lookup", "reuse", "model")


@dataclass
class DraftContext:
    """What a drafter may read at one verification step of `drafted_generate`: the live rows
    (their batch index), their tokens so far, the policy and its cache (positions, attention mask
    of the cache rows), the target transform (raw logits -> sampled distribution), eos, and the
    counters a drafter that runs a model adds to."""

    rows: list
    prompts: list
    gen: list
    k: int
    model: object = None
    cache: object = None
    last: object = None       # [n] each live row's last token (fed first in the block)
    mask: object = None       # [n, S] attention mask of the cache rows
    next_pos: object = None   # [n] position of each live row's next token
    target: object = None
    eos: int | None = None
    cost: dict = field(default_factory=dict)

    def contexts(self) -> list[list[int]]:
        return [self.prompts[i] + self.gen[i] for i in self.rows]

    @property
    def done(self) -> list[int]:
        return [len(self.gen[i]) for i in self.rows]


class Drafter:
    name = "base"
    exact = True
    drafts_first = False  # also drafts the first response token (verified on the prefill's p)

    def propose(self, rows: Sequence[int], contexts: list[list[int]], done: list[int],
                k: int) -> list[list[int]]:
        """Up to `k` draft tokens for each live row (`rows`: its index in the batch;
        `contexts`: its prompt + response so far; `done`: its response length so far)."""
        raise NotImplementedError

    def draft(self, ctx: DraftContext) -> tuple[list[list[int]], list | None]:
        """(drafts, q): each live row's drafted tokens and, for a drafter that samples them, the
        distribution each was drawn from ([len(draft), V] per row); None: point masses."""
        return self.propose(ctx.rows, ctx.contexts(), ctx.done, ctx.k), None

    def accept(self, p_x: float, row: int, pos: int, u: float) -> bool:
        return u < p_x

    def observe(self, responses: list[list[int]]) -> None:
        """The batch's finished responses (what a history drafter learns from)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class LookupDrafter(Drafter):
    """n-gram lookup against the row's context and the last `memory` responses (point mass)."""

    name = "lookup"

    def __init__(self, n: int = 3, memory: int = 256):
        self.n, self.memory = n, memory
        self.history: list[list[int]] = []

    def propose(self, rows, contexts, done, k):
        out = []
        for ctx in contexts:
            out.append(self._match(ctx, k) if k > 0 else [])
        return out

    def _match(self, ctx: list[int], k: int) -> list[int]:
        for n in range(min(self.n, len(ctx) - 1), 0, -1):
            key = ctx[-n:]
            for src in [ctx[:-1], *reversed(self.history)]:
                for s in range(len(src) - n, -1, -1):  # the latest occurrence first
                    if src[s:s + n] == key and s + n < len(src):
                        return src[s + n: s + n + k]
        return []

    def observe(self, responses):
        self.history = (self.history + [list(r) for r in responses if r])[-self.memory:]

    def state_dict(self):
        return {"history": [list(h) for h in self.history]}

    def load_state_dict(self, state):
        self.history = [list(h) for h in state["history"]]


class ReuseDrafter(Drafter):
    """Each row's previous response with its stored log-probs (`prepare`), SPEC-RL's rule.

    In the trainer (features/drafts.py) the responses come from `store`: the last responses of
    each prompt id with the log-probs of the distribution they were sampled from (`remember`),
    the k-th row of a prompt in a batch drafting from its k-th stored response
    (`prepare_prompts`)."""

    name = "reuse"
    exact = False
    drafts_first = True  # the old response from its first token on (SPEC-RL)

    def __init__(self, lenience: float = math.exp(0.5)):
        self.lenience, self.old, self.old_logprobs = lenience, [], []
        self.store: dict[str, list[list]] = {}  # prompt id -> [[tokens, log-probs], ...]

    def prepare(self, old: list[list[int]], old_logprobs: list[list[float]]) -> None:
        self.old, self.old_logprobs = old, old_logprobs

    def prepare_prompts(self, prompt_ids: Sequence[str]) -> None:
        """Per batch row, the stored response of its prompt id (none: no draft)."""
        seen: dict[str, int] = {}
        old, lps = [], []
        for pid in prompt_ids:
            k = seen[pid] = seen.get(pid, -1) + 1
            kept = self.store.get(pid, [])
            tokens, lp = kept[k] if k < len(kept) else ([], [])
            old.append(list(tokens))
            lps.append(list(lp))
        self.prepare(old, lps)

    def remember(self, prompt_ids: Sequence[str], responses: Sequence[Sequence[int]],
                 logprobs: Sequence[Sequence[float]]) -> None:
        """The batch's responses replace what was stored for their prompt ids."""
        fresh: dict[str, list[list]] = {}
        for pid, tokens, lp in zip(prompt_ids, responses, logprobs):
            fresh.setdefault(pid, []).append([list(tokens), list(lp)])
        self.store.update(fresh)

    def state_dict(self):
        return {"store": self.store}

    def load_state_dict(self, state):
        self.store = {k: [[list(t), list(lp)] for t, lp in v] for k, v in state["store"].items()}

    def propose(self, rows, contexts, done, k):
        out = []
        for r, ctx, d in zip(rows, contexts, done):
            old = self.old[r] if r < len(self.old) else []
            ok = d <= len(old) and (d == 0 or ctx[-d:] == old[:d])  # still on the old path
            out.append(old[d: d + k] if ok else [])
        return out

    def accept(self, p_x, row, pos, u):
        q = math.exp(self.old_logprobs[row][pos])
        return u < min(1.0, self.lenience * p_x / max(q, 1e-30))


def resolve(drafter: Drafter, p, x: int, u: float, row: int, pos: int,
            q=None) -> tuple[int, bool]:
    """(token, accepted) at one drafted position of row `row`: target probabilities `p` [V],
    draft token `x`, a fresh uniform `u`. Drawn from a distribution `q` [V]: accept with
    min(1, p(x) / q(x)), else sample max(0, p - q) renormalised (draft_model.py). A point mass
    of an exact drafter: accept with p(x), else sample p without x (module docstring); reuse
    (not exact): its own rule, else a fresh sample from p."""
    if q is not None:
        if u < min(1.0, float(p[x]) / float(q[x])):  # q(x) > 0: x was drawn from q
            return x, True
        rest = (p - q).clamp_min(0)
    elif drafter.accept(float(p[x]), row, pos, u):
        return x, True
    elif drafter.exact:  # the residual of a point mass: p without x
        rest = p.clone()
        rest[x] = 0
    else:  # SPEC-RL: a fresh sample from p at the first rejection
        rest = p
    rest = rest / rest.sum() if rest.sum() > 0 else p  # 0 only where rejection has chance 0
    return int(torch.multinomial(rest, 1)), False


def get_drafter(name: str, cfg=None) -> Drafter | None:
    """The drafter called `name` (one of DRAFTS; "none": None), with `cfg`'s (PPOConfig)
    parameters where it has any; a one-line error for an unknown name."""
    from rlhf.pipeline.config import ConfigError

    if name == "none":
        return None
    if name == "lookup":
        return LookupDrafter()
    if name == "reuse":
        return ReuseDrafter()
    if name == "model":
        from rlhf.pipeline.draft_model import ModelDrafter

        return ModelDrafter(getattr(cfg, "draft_layers", 0))
    raise ConfigError(f"unknown draft {name!r}; drafts: {', '.join(DRAFTS)}")


@torch.no_grad()
def drafted_generate(model, tokenizer, enc, sampling: Sampling, drafter: Drafter, k: int = 4,
                     *, suppress_pad: bool = True, keep_logits: bool = False) -> Generated:
    """Native decoding with drafts verified by `drafter.accept` (module docstring). No logits
    processors or stopping criteria beyond eos and max_new_tokens (their per-step calls do not
    line up with several tokens a forward). Returns `Generated` with each row's drafted and
    accepted tokens (`row_drafted` / `row_accepted`): every token the drafter proposed for the
    row, the ones after a rejection in the same block too (proposed, never verified), and of
    those the ones the rule accepted (reuse: the tokens kept from the old response)."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    ids, mask = enc["input_ids"], enc["attention_mask"]
    B, P = ids.shape
    dev = ids.device
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    fill = pad if pad is not None else 0
    temp = 1.0 if sampling.greedy else sampling.temperature
    warpers = [] if sampling.greedy else [TemperatureLogitsWarper(sampling.temperature)] + (
        [TopPLogitsWarper(sampling.top_p)] if sampling.top_p < 1.0 else [])
    suppress = suppress_pad and pad is not None and pad != eos
    budget = sampling.max_new_tokens

    def target(raw):  # [n, V] raw logits -> the sampled distribution's probabilities
        s = raw.float().clone()
        if suppress:
            s[:, pad] = -float("inf")
        for w in warpers:
            s = w(None, s)
        if sampling.greedy:
            return torch.nn.functional.one_hot(s.argmax(-1), s.shape[-1]).float()
        return torch.softmax(s, -1)

    prompts = [ids[i][mask[i].bool()].tolist() for i in range(B)]
    gen: list[list[int]] = [[] for _ in range(B)]
    lp: list[list[float]] = [[] for _ in range(B)]
    slp: list[list[float]] = [[] for _ in range(B)]  # log-probs under the sampled distribution
    ent: list[list[float]] = [[] for _ in range(B)]
    kept: list[list] = [[] for _ in range(B)]  # raw logits / temperature (keep_logits)

    def scored(raw):  # [..., V] -> (log-probs of the trainer's definition, entropies), as lists
        logp = torch.log_softmax(raw.float() / (temp + 1e-7), -1)
        return logp.tolist(), (-(logp.exp() * logp).nansum(-1)).tolist()

    def emit(i, tok, logp_row, ent_row, raw_row, p_row):
        if keep_logits:
            kept[i].append(raw_row.float() / (temp + 1e-7))
        gen[i].append(tok)
        lp[i].append(logp_row[tok])
        slp[i].append(math.log(float(p_row[tok])))  # > 0: tok was drawn or accepted under p
        ent[i].append(ent_row)

    cache, raw0 = prefill(model, ids, mask)
    forwards, token_forwards, batch_sizes = 1, B * P, [B]
    drafted, accepted = [0] * B, [0] * B  # per row
    p0 = target(raw0)
    first = torch.multinomial(p0, 1).squeeze(1).tolist()
    lp0, ent0 = scored(raw0)
    if drafter.drafts_first:  # a first drafted token is verified on the prefill's p: no forward
        d0 = drafter.propose(list(range(B)), [list(x) for x in prompts], [0] * B, 1)
        u0 = torch.rand(B).tolist()
        for i, d in enumerate(d0):
            if d:
                first[i], ok = resolve(drafter, p0[i], d[0], u0[i], i, 0)
                drafted[i], accepted[i] = drafted[i] + 1, accepted[i] + ok
    for i in range(B):
        emit(i, first[i], lp0[i], ent0[i], raw0[i], p0[i])
    live = [i for i in range(B) if not (first[i] == eos or budget <= 1)]
    keep = torch.tensor(live, dtype=torch.long, device=dev)
    cache.batch_select_indices(keep)
    live_mask, next_pos = mask[keep], mask.sum(1)[keep]
    costs = {"draft_forwards": 0, "draft_token_forwards": 0, "draft_share": 0.0}
    while live:
        left = [budget - len(gen[i]) for i in live]           # tokens each row may still add
        last = torch.tensor([gen[i][-1] for i in live], dtype=torch.long, device=dev)
        drafts, qs = drafter.draft(DraftContext(
            live, prompts, gen, min(k, max(left) - 1), model, cache, last, live_mask, next_pos,
            target, eos, costs))
        drafts = [d[: max(n - 1, 0)] for d, n in zip(drafts, left)]
        K = max(len(d) for d in drafts)
        block = torch.full((len(live), 1 + K), fill, dtype=torch.long, device=dev)
        for r, (i, d) in enumerate(zip(live, drafts)):
            block[r, 0] = gen[i][-1]
            if d:
                block[r, 1: 1 + len(d)] = torch.tensor(d, device=dev)
        attn = torch.cat([live_mask, torch.ones_like(block)], 1)
        pos = next_pos[:, None] + torch.arange(1 + K, device=dev)[None, :]
        out = model(input_ids=block, attention_mask=attn, position_ids=pos, cache=cache,
                    use_cache=True)
        forwards += 1
        token_forwards += block.numel()
        batch_sizes.append(len(live))
        raw = out.logits                                        # [n, 1 + K, V]
        p = target(raw.reshape(-1, raw.shape[-1])).reshape(raw.shape)
        logp, ents = scored(raw)
        uniforms = torch.rand(len(live), K).tolist()  # fresh, drawn after the drafts
        still, n_acc = [], []
        for r, (i, d) in enumerate(zip(live, drafts)):
            drafted[i] += len(d)
            a, stop = 0, False
            for j, x in enumerate(d):
                tok, ok = resolve(drafter, p[r, j], x, uniforms[r][j], i, len(gen[i]),
                                  None if qs is None else qs[r][j])
                emit(i, tok, logp[r][j], ents[r][j], raw[r, j], p[r, j])
                if not ok:  # the first rejection ends the row's drafts
                    break
                a += 1
                if x == eos:
                    stop = True
                    break
            else:
                if not stop:  # every draft accepted: one more token from the last position
                    emit(i, int(torch.multinomial(p[r, len(d)], 1)), logp[r][len(d)],
                         ents[r][len(d)], raw[r, len(d)], p[r, len(d)])
            accepted[i] += a
            n_acc.append(a)
            slots = torch.zeros(1 + K, dtype=live_mask.dtype, device=dev)
            slots[: 1 + a] = 1   # the fed token and the accepted drafts; rejected slots masked
            attn[r, -(1 + K):] = slots
            stop = stop or gen[i][-1] == eos or len(gen[i]) >= budget
            still.append(not stop)
        next_pos = next_pos + 1 + torch.tensor(n_acc, device=dev)
        idx = torch.tensor([r for r, s in enumerate(still) if s], dtype=torch.long, device=dev)
        live = [i for i, s in zip(live, still) if s]
        if len(idx) < len(still):
            cache.batch_select_indices(idx)
        live_mask, next_pos = attn[idx], next_pos[idx]
    for i in range(B):  # the cut at the first eos (the budget is never overshot)
        if eos in gen[i]:
            cut = gen[i].index(eos) + 1
            gen[i], lp[i], ent[i], slp[i] = gen[i][:cut], lp[i][:cut], ent[i][:cut], slp[i][:cut]
            kept[i] = kept[i][:cut]
    T = max(len(g) for g in gen)
    seq = torch.full((B, P + T), fill, dtype=torch.long, device=dev)
    seq[:, :P] = ids
    logprobs, entropy = torch.zeros(B, T, device=dev), torch.zeros(B, T, device=dev)
    sampled = torch.zeros(B, T, device=dev)
    for i in range(B):
        n = len(gen[i])
        seq[i, P: P + n] = torch.tensor(gen[i], device=dev)
        logprobs[i, :n], entropy[i, :n] = torch.tensor(lp[i]), torch.tensor(ent[i])
        sampled[i, :n] = torch.tensor(slp[i])
    logits = None
    if keep_logits:
        logits = torch.zeros(B, T, raw0.shape[-1], device=dev)
        for i in range(B):
            logits[i, : len(kept[i])] = torch.stack(kept[i])
    drafter.observe(gen)
    return Generated(sequences=seq, prompt_len=P, forwards=forwards,
                     token_forwards=token_forwards, batch_sizes=batch_sizes,
                     sampled_logprobs=sampled, logprobs=logprobs, entropy=entropy,
                     logits=logits, row_drafted=drafted, row_accepted=accepted, **costs)
