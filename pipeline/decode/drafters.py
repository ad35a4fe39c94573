"""The drafters of drafted decoding (pipeline/decode/drafted.py): what proposes up to k next
tokens per row for the policy to verify in one forward.

- `lookup`: the last n tokens of a row (n = 3, 2, 1) matched against the row's own context
  (prompt and response so far) and the recent responses it has seen; the tokens that followed
  the latest match are the draft, a point mass. Exact under the point-mass rule.
- `reuse`: the prompt's previous response and its stored log-probs (SPEC-RL's sample reuse),
  accepted by SPEC-RL's rule (`ReuseDrafter.accept`). An arm, NOT exact (drafted.py says why).
- `model`: the policy's own first layers draft k tokens from a distribution q known at
  verification (pipeline/decode/draft_model.py, whose docstring proves the rule it is verified
  with exact: accept with min(1, p/q), residual max(0, p - q)).

A drafter's state (the lookup history, the reuse store, the draft model's depth) is what the
trainer checkpoints (`state_dict`; pipeline/ppo/features/drafts.py holds the run's drafter).

    python -c "from rlhf.pipeline.decode import get_drafter; print(get_drafter('lookup').name)"
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    """Proposes drafts (`propose`, or `draft` for one that runs a model), learns from finished
    responses (`observe`) and carries its state across steps (`state_dict`)."""

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
