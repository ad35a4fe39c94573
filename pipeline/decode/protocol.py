"""The seam every sampling stage goes through: a `Generator` (an engine) takes left-padded
prompts, a `Sampling` and the caller's per-sequence hooks and returns a `Generated` (the token
ids, the counted compute and, where the engine has them, the per-token log-probs of the sampled
tokens). `get_generator(name, draft=...)` builds one (pipeline/decode/engines.py).

    python -c "from rlhf.pipeline.decode import Generator; help(Generator.generate)"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlhf.pipeline.decode.sampling import Sampling


@dataclass
class Generated:
    """What an engine returns for one batch: `sequences` [B, P + T] (prompt, then the generated
    tokens, pad after a row stopped), the counted compute, and, where the engine has them, the
    per-token log-probs of the sampled tokens ([B, T]; positions after a row's stop hold 0):
    `sampled_logprobs` under the distribution actually sampled (after the processors,
    temperature and top-p), `logprobs` / `entropy` under the trainer's old-log-prob definition
    (full-vocabulary softmax of the raw logits / temperature) and optionally those `logits`
    [B, T, V].

    Drafts are counted per row (`row_drafted` / `row_accepted`, one int a row, the one source of
    truth); `drafted` / `accepted` are their sums. A batch decoded without a drafter (hf, plain
    native) has 0 in every row. `draft_off`: a drafting generator decoded this batch without
    drafts (the caller's hooks need a call per token: `DraftedGenerator`)."""

    sequences: object
    prompt_len: int
    forwards: int               # sequential policy forwards (prefill + decode steps)
    token_forwards: int         # token positions pushed through the policy
    batch_sizes: list           # rows in each forward
    sampled_logprobs: object = None
    logprobs: object = None
    entropy: object = None
    logits: object = None
    row_drafted: list | None = None   # [B] tokens a drafter proposed for the row (drafters.py)
    row_accepted: list | None = None  # [B] of those, accepted by the verification rule
    draft_forwards: int = 0     # sequential forwards of a draft model (draft_model.py)
    draft_token_forwards: int = 0  # token positions it pushed through its layers ...
    draft_share: float = 0.0    # ... which are this share of the policy's layers
    draft_off: bool = False

    def __post_init__(self):
        rows = int(self.sequences.shape[0])
        self.row_drafted = [int(n) for n in (self.row_drafted or [0] * rows)]
        self.row_accepted = [int(n) for n in (self.row_accepted or [0] * rows)]
        if not len(self.row_drafted) == len(self.row_accepted) == rows:
            raise ValueError(f"per-row draft counts for {len(self.row_drafted)} / "
                             f"{len(self.row_accepted)} rows, the batch has {rows}")

    @property
    def drafted(self) -> int:
        """Tokens a drafter proposed in the batch (the sum over rows)."""
        return sum(self.row_drafted)

    @property
    def accepted(self) -> int:
        """Of those, accepted (the sum over rows)."""
        return sum(self.row_accepted)

    @property
    def tokens(self):
        """[B, T] the generated part of `sequences`."""
        return self.sequences[:, self.prompt_len:]


class Generator:
    """An engine: left-padded prompts `enc` + `Sampling` + per-sequence hooks -> `Generated`.

    The seam every sampling stage goes through (`get_generator(name)`). An engine that holds
    its own copy of the weights (vLLM) gets them through `sync_weights(model)` before a step's
    generation; the in-process engines read `model` directly and do nothing there."""

    name = "base"
    has_logprobs = False  # whether `Generated.logprobs` comes back (the old-log-prob pass)

    def sync_weights(self, model) -> None:
        return None

    def generate(self, model, tokenizer, enc, sampling: Sampling, *,
                 logits_processors: Sequence = (), stopping_criteria: Sequence = (),
                 suppress_pad: bool = True, keep_logits: bool = False) -> Generated:
        raise NotImplementedError
