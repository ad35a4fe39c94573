"""Drafted decoding for the native engine: a drafter (pipeline/decode/drafters.py) proposes up to
k next tokens per row, the policy scores them all in **one** forward, and an accept rule keeps a
prefix of them. `DraftedGenerator` is the native engine with a drafter
(`get_generator("native", draft=drafter)`).

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
A draft drawn from a distribution q (the draft model) is accepted with min(1, p(x) / q(x)), its
residual max(0, p - q): pipeline/decode/draft_model.py proves that rule exact.

The reuse rule (SPEC-RL, arXiv 2509.23232): accept the old token x with probability
min(1, l p(x) / q_old(x)), q_old its stored log-prob, l = e^0.5; at the first rejection the row
samples afresh from p. P(y) is then min(1, l p(x)/q_old(x)) at y = x plus the rejection mass
times p(y), which is not p(y) in general (no residual, and the lenience l): when the policy has
not moved (p = q_old) the old token comes back with probability 1. tests/test_drafts.py
shows this rule failing the exactness test that the point-mass rule passes.

Stopping criteria that read only the clock (the generation time-out, `MaxTimeCriteria`) are
checked after the first token and after every verification, as the plain loop checks them after
every token; a stopped row leaves the batch. Logits processors and per-token criteria (a hook's)
are called once per token, which several tokens a forward cannot give them: `DraftedGenerator`
then decodes the batch plain (`Generated.draft_off`).

    python -c "from rlhf.pipeline.decode import drafted_generate; help(drafted_generate)"
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from rlhf.pipeline.decode.drafters import DraftContext, Drafter
from rlhf.pipeline.decode.native import native_generate, prefill
from rlhf.pipeline.decode.protocol import Generated, Generator
from rlhf.pipeline.decode.sampling import Sampling


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


class _Decode:
    """One drafted decode's state: each row's tokens and their scores (lists, a row at its own
    length), the policy's cache of the live rows (their attention mask and next positions), and
    the counted compute."""

    def __init__(self, model, tokenizer, enc, sampling: Sampling, drafter: Drafter,
                 criteria: Sequence, suppress_pad: bool, keep_logits: bool):
        from transformers import TemperatureLogitsWarper, TopPLogitsWarper

        self.model, self.drafter, self.criteria = model, drafter, list(criteria)
        self.ids, self.mask = enc["input_ids"], enc["attention_mask"]
        self.B, self.P = self.ids.shape
        self.dev = self.ids.device
        self.pad, self.eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        self.fill = self.pad if self.pad is not None else 0
        self.greedy = sampling.greedy
        self.temp = 1.0 if sampling.greedy else sampling.temperature
        self.warpers = [] if sampling.greedy else (
            [TemperatureLogitsWarper(sampling.temperature)]
            + ([TopPLogitsWarper(sampling.top_p)] if sampling.top_p < 1.0 else []))
        self.suppress = suppress_pad and self.pad is not None and self.pad != self.eos
        self.budget = sampling.max_new_tokens
        self.keep_logits = keep_logits
        B = self.B
        self.prompts = [self.ids[i][self.mask[i].bool()].tolist() for i in range(B)]
        self.gen: list[list[int]] = [[] for _ in range(B)]
        self.lp: list[list[float]] = [[] for _ in range(B)]
        self.slp: list[list[float]] = [[] for _ in range(B)]  # under the sampled distribution
        self.ent: list[list[float]] = [[] for _ in range(B)]
        self.kept: list[list] = [[] for _ in range(B)]  # raw logits / temperature (keep_logits)
        self.drafted, self.accepted = [0] * B, [0] * B  # per row
        self.costs = {"draft_forwards": 0, "draft_token_forwards": 0, "draft_share": 0.0}

    def target(self, raw):
        """[n, V] raw logits -> the sampled distribution's probabilities."""
        s = raw.float().clone()
        if self.suppress:
            s[:, self.pad] = -float("inf")
        for w in self.warpers:
            s = w(None, s)
        if self.greedy:
            return torch.nn.functional.one_hot(s.argmax(-1), s.shape[-1]).float()
        return torch.softmax(s, -1)

    def scored(self, raw):
        """[..., V] -> (log-probs of the trainer's definition, entropies), as lists."""
        logp = torch.log_softmax(raw.float() / (self.temp + 1e-7), -1)
        return logp.tolist(), (-(logp.exp() * logp).nansum(-1)).tolist()

    def emit(self, i, tok, logp_row, ent_row, raw_row, p_row):
        if self.keep_logits:
            self.kept[i].append(raw_row.float() / (self.temp + 1e-7))
        self.gen[i].append(tok)
        self.lp[i].append(logp_row[tok])
        self.slp[i].append(math.log(float(p_row[tok])))  # > 0: tok was drawn or accepted under p
        self.ent[i].append(ent_row)

    def sequences(self):
        """[B, P + T] the prompts and each row's tokens so far (fill after a row's end)."""
        T = max(len(g) for g in self.gen)
        seq = torch.full((self.B, self.P + T), self.fill, dtype=torch.long, device=self.dev)
        seq[:, :self.P] = self.ids
        for i, g in enumerate(self.gen):
            seq[i, self.P: self.P + len(g)] = torch.tensor(g, device=self.dev)
        return seq

    def stopped(self) -> list[bool]:
        """Each row's verdict of the stopping criteria on the sequences so far (a criterion may
        return one bool or one per row; scores None: a verification scores several positions)."""
        if not self.criteria:
            return [False] * self.B
        seq = self.sequences()
        done = torch.zeros(self.B, dtype=torch.bool, device=self.dev)
        for c in self.criteria:
            done |= torch.as_tensor(c(seq, None), device=self.dev).expand(self.B).bool()
        return done.tolist()

    def first(self) -> list[int]:
        """The prefill and every row's first token (a first draft verified on the prefill's p);
        the rows still live after it."""
        B, eos = self.B, self.eos
        self.cache, self.raw0 = prefill(self.model, self.ids, self.mask)
        raw0 = self.raw0
        self.forwards, self.token_forwards, self.batch_sizes = 1, B * self.P, [B]
        p0 = self.target(raw0)
        first = torch.multinomial(p0, 1).squeeze(1).tolist()
        lp0, ent0 = self.scored(raw0)
        if self.drafter.drafts_first:  # verified on the prefill's p: no forward
            d0 = self.drafter.propose(list(range(B)), [list(x) for x in self.prompts], [0] * B, 1)
            u0 = torch.rand(B).tolist()
            for i, d in enumerate(d0):
                if d:
                    first[i], ok = resolve(self.drafter, p0[i], d[0], u0[i], i, 0)
                    self.drafted[i], self.accepted[i] = self.drafted[i] + 1, self.accepted[i] + ok
        for i in range(B):
            self.emit(i, first[i], lp0[i], ent0[i], raw0[i], p0[i])
        stop = self.stopped()
        live = [i for i in range(B) if not (first[i] == eos or self.budget <= 1 or stop[i])]
        keep = torch.tensor(live, dtype=torch.long, device=self.dev)
        self.cache.batch_select_indices(keep)
        self.live_mask, self.next_pos = self.mask[keep], self.mask.sum(1)[keep]
        return live

    def verify(self, live: list[int], k: int) -> list[int]:
        """One forward over each live row's last token and its drafts, the accept rule on every
        draft; the rows still live after it."""
        gen, dev = self.gen, self.dev
        left = [self.budget - len(gen[i]) for i in live]     # tokens each row may still add
        last = torch.tensor([gen[i][-1] for i in live], dtype=torch.long, device=dev)
        drafts, qs = self.drafter.draft(DraftContext(
            live, self.prompts, gen, min(k, max(left) - 1), self.model, self.cache, last,
            self.live_mask, self.next_pos, self.target, self.eos, self.costs))
        drafts = [d[: max(n - 1, 0)] for d, n in zip(drafts, left)]
        K = max(len(d) for d in drafts)
        block = torch.full((len(live), 1 + K), self.fill, dtype=torch.long, device=dev)
        for r, (i, d) in enumerate(zip(live, drafts)):
            block[r, 0] = gen[i][-1]
            if d:
                block[r, 1: 1 + len(d)] = torch.tensor(d, device=dev)
        attn = torch.cat([self.live_mask, torch.ones_like(block)], 1)
        pos = self.next_pos[:, None] + torch.arange(1 + K, device=dev)[None, :]
        out = self.model(input_ids=block, attention_mask=attn, position_ids=pos,
                         cache=self.cache, use_cache=True)
        self.forwards += 1
        self.token_forwards += block.numel()
        self.batch_sizes.append(len(live))
        raw = out.logits                                        # [n, 1 + K, V]
        p = self.target(raw.reshape(-1, raw.shape[-1])).reshape(raw.shape)
        logp, ents = self.scored(raw)
        uniforms = torch.rand(len(live), K).tolist()  # fresh, drawn after the drafts
        still, n_acc = [], []
        for r, (i, d) in enumerate(zip(live, drafts)):
            a, stop = self.accept_row(r, i, d, p, logp, ents, raw, uniforms[r], qs)
            n_acc.append(a)
            slots = torch.zeros(1 + K, dtype=self.live_mask.dtype, device=dev)
            slots[: 1 + a] = 1   # the fed token and the accepted drafts; rejected slots masked
            attn[r, -(1 + K):] = slots
            stop = stop or gen[i][-1] == self.eos or len(gen[i]) >= self.budget
            still.append(not stop)
        next_pos = self.next_pos + 1 + torch.tensor(n_acc, device=dev)
        if self.criteria:  # a stopped row leaves like a finished one
            done = self.stopped()
            still = [s and not done[i] for i, s in zip(live, still)]
        idx = torch.tensor([r for r, s in enumerate(still) if s], dtype=torch.long, device=dev)
        if len(idx) < len(still):
            self.cache.batch_select_indices(idx)
        self.live_mask, self.next_pos = attn[idx], next_pos[idx]
        return [i for i, s in zip(live, still) if s]

    def accept_row(self, r, i, d, p, logp, ents, raw, uniforms, qs) -> tuple[int, bool]:
        """The accept rule along live row `r` (batch row `i`)'s drafts `d`, emitting each
        verified token: (drafts accepted, whether the row ended on an accepted eos)."""
        self.drafted[i] += len(d)
        a, stop = 0, False
        for j, x in enumerate(d):
            tok, ok = resolve(self.drafter, p[r, j], x, uniforms[j], i, len(self.gen[i]),
                              None if qs is None else qs[r][j])
            self.emit(i, tok, logp[r][j], ents[r][j], raw[r, j], p[r, j])
            if not ok:  # the first rejection ends the row's drafts
                break
            a += 1
            if x == self.eos:
                stop = True
                break
        else:
            if not stop:  # every draft accepted: one more token from the last position
                n = len(d)
                self.emit(i, int(torch.multinomial(p[r, n], 1)), logp[r][n], ents[r][n],
                          raw[r, n], p[r, n])
        self.accepted[i] += a
        return a, stop

    def result(self) -> Generated:
        """Every row cut at its first eos (the budget is never overshot), as `Generated`."""
        B, P, dev, eos = self.B, self.P, self.dev, self.eos
        gen, lp, ent, slp, kept = self.gen, self.lp, self.ent, self.slp, self.kept
        for i in range(B):
            if eos in gen[i]:
                cut = gen[i].index(eos) + 1
                gen[i], lp[i], ent[i] = gen[i][:cut], lp[i][:cut], ent[i][:cut]
                slp[i], kept[i] = slp[i][:cut], kept[i][:cut]
        T = max(len(g) for g in gen)
        seq = self.sequences()
        logprobs, entropy = torch.zeros(B, T, device=dev), torch.zeros(B, T, device=dev)
        sampled = torch.zeros(B, T, device=dev)
        for i in range(B):
            n = len(gen[i])
            logprobs[i, :n], entropy[i, :n] = torch.tensor(lp[i]), torch.tensor(ent[i])
            sampled[i, :n] = torch.tensor(slp[i])
        logits = None
        if self.keep_logits:
            logits = torch.zeros(B, T, self.raw0.shape[-1], device=dev)
            for i in range(B):
                logits[i, : len(kept[i])] = torch.stack(kept[i])
        return Generated(sequences=seq, prompt_len=P, forwards=self.forwards,
                         token_forwards=self.token_forwards, batch_sizes=self.batch_sizes,
                         sampled_logprobs=sampled, logprobs=logprobs, entropy=entropy,
                         logits=logits, row_drafted=self.drafted, row_accepted=self.accepted,
                         **self.costs)


@torch.no_grad()
def drafted_generate(model, tokenizer, enc, sampling: Sampling, drafter: Drafter, k: int = 4,
                     *, stopping_criteria: Sequence = (), suppress_pad: bool = True,
                     keep_logits: bool = False) -> Generated:
    """Native decoding with drafts verified by `drafter.accept` (module docstring). No logits
    processors; `stopping_criteria` are checked after the first token and after every
    verification (made for the ones that read only the clock: module docstring), besides eos
    and max_new_tokens. Returns `Generated` with each row's drafted and accepted tokens
    (`row_drafted` / `row_accepted`): every token the drafter proposed for the row, the ones
    after a rejection in the same block too (proposed, never verified), and of those the ones
    the rule accepted (reuse: the tokens kept from the old response)."""
    run = _Decode(model, tokenizer, enc, sampling, drafter, stopping_criteria, suppress_pad,
                  keep_logits)
    live = run.first()
    while live:
        live = run.verify(live, k)
    made = run.result()
    drafter.observe(run.gen)
    return made


def _clock_only(criterion) -> bool:
    """Whether a stopping criterion reads only the clock (a verification can check it)."""
    from transformers import MaxTimeCriteria

    return isinstance(criterion, MaxTimeCriteria)


class DraftedGenerator(Generator):
    """The native engine with a drafter: `drafted_generate` with up to `k` drafts per row and
    forward. Given logits processors or a criterion that needs a call per token (a generation
    hook's), it decodes the batch plain (`native_generate`, with every hook) and says so
    (`Generated.draft_off`)."""

    name = "native"
    has_logprobs = True

    def __init__(self, drafter: Drafter, k: int = 4):
        self.drafter, self.k = drafter, k

    def generate(self, model, tokenizer, enc, sampling, *, logits_processors=(),
                 stopping_criteria=(), suppress_pad=True, keep_logits=False) -> Generated:
        if logits_processors or not all(_clock_only(c) for c in stopping_criteria):
            made = native_generate(model, tokenizer, enc, sampling,
                                   logits_processors=logits_processors,
                                   stopping_criteria=stopping_criteria,
                                   suppress_pad=suppress_pad, keep_logits=keep_logits)
            made.draft_off = True
            return made
        return drafted_generate(model, tokenizer, enc, sampling, self.drafter, self.k,
                                stopping_criteria=stopping_criteria, suppress_pad=suppress_pad,
                                keep_logits=keep_logits)
