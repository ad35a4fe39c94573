"""The one generation module: how every stage prompts a causal LM, samples, cuts and scores tokens.

Shared by the PPO trainer, `eval`, `preferences`, `reward`, `difficulty` and `sft` (through
`pipeline/policy.sample`), so that a response means the same thing everywhere:

- prompts are rendered with `text.format_prompt`, **left-padded** (and optionally truncated to
  `max_prompt_tokens`); position ids count real tokens only, so a padded row sees the positions
  it would see alone;
- a response is the generated tokens **up to and including the first eos**; a row that never
  emitted eos keeps its non-pad tokens (a sequence stopped by a per-sequence stopping criterion
  ends there too);
- log-probabilities and entropies come from **full-vocabulary** distributions (seed 000 §5.4),
  of the logits divided by the sampling temperature (the distribution actually sampled);
- sampling settings are one `Sampling` value (temperature, top-p, max new tokens).

    python -c "from rlhf.pipeline.generation import cut_at_eos; print(cut_at_eos([5, 6, 2, 0], eos=2, pad=0))"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlhf.pipeline.text import format_prompt


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # <= 0: greedy
    top_p: float = 1.0
    max_new_tokens: int = 48

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def encode_prompts(tokenizer, prompts: Sequence[str], max_prompt_tokens: int | None = None):
    """Left-padded `format_prompt` encodings ({"input_ids", "attention_mask"}, [B, P])."""
    tokenizer.padding_side = "left"
    kw = {"truncation": True, "max_length": max_prompt_tokens} if max_prompt_tokens else {}
    return tokenizer([format_prompt(p) for p in prompts], return_tensors="pt", padding=True, **kw)


def cut_at_eos(ids: Sequence[int], eos: int | None, pad: int | None) -> list[int]:
    """The response tokens of one generated row: up to and including the first eos, else every
    non-pad token (when pad is eos, the first eos is the stop and nothing after it is kept)."""
    ids = list(ids)
    if eos is not None and eos in ids:
        return ids[: ids.index(eos) + 1]
    return [t for t in ids if t != pad]


def generate(model, tokenizer, enc, sampling: Sampling, *, num_return_sequences: int = 1,
             logits_processors: Sequence = (), stopping_criteria: Sequence = (),
             suppress_pad: bool = True, output_logits: bool = False):
    """model.generate on left-padded `enc` with these sampling settings; returns the
    transformers output (`.sequences` [rows, P + T], `.logits` if asked).

    `logits_processors` / `stopping_criteria`: per-sequence hooks (transformers objects). A
    stopping criterion that returns a per-row bool stops that row only; the row then gets pad
    tokens, which `cut_at_eos` drops, so it costs no further tokens in the accounting.
    `suppress_pad`: a sampled pad token would read as padding downstream (critic mask, seed 000
    §5.3), so it is never sampled unless pad doubles as eos."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    greedy = sampling.greedy
    return model.generate(
        **enc, do_sample=not greedy, temperature=None if greedy else sampling.temperature,
        top_p=None if greedy else sampling.top_p, top_k=None if greedy else 0,
        max_new_tokens=sampling.max_new_tokens,
        num_return_sequences=1 if greedy else num_return_sequences,
        pad_token_id=pad, eos_token_id=eos,
        suppress_tokens=[pad] if suppress_pad and pad is not None and pad != eos else None,
        logits_processor=LogitsProcessorList(list(logits_processors)),
        stopping_criteria=StoppingCriteriaList(list(stopping_criteria)),
        output_logits=output_logits, return_dict_in_generate=True)


def position_ids(mask):
    """[B, L] positions of a left-padded mask: 0 at the first real token."""
    return (mask.cumsum(-1) - 1).clamp_min(0)


def prefill(model, ids, mask):
    """The prompt forward of a decode loop over left-padded `ids` / `mask` ([B, P]): (the
    filled `DynamicCache`, the [B, V] logits of the next token). The LM head runs on the last
    position only where the model supports it (`logits_to_keep`, as model.generate asks)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    keep1 = {"logits_to_keep": 1} if getattr(model, "_supports_logits_to_keep",
                                             lambda: False)() else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                cache=cache, use_cache=True, **keep1)
    return cache, out.logits[:, -1]


def response_logits(model, query, query_mask, response, response_mask, temperature: float):
    """[B, T, V] logits / temperature at the T response positions of left-padded prompts
    ([B, P]) followed by right-padded responses ([B, T]): what scored the sampled tokens."""
    import torch

    ids = torch.cat([query, response], 1)
    mask = torch.cat([query_mask, response_mask.long()], 1)
    P, T = query.shape[1], response.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    return logits[:, P - 1: P - 1 + T].float() / (temperature + 1e-7)


def token_logprobs(logits, tokens):
    """[B, T] log-probability of each token under full-vocabulary softmax of `logits`."""
    from trl.trainer.utils import selective_log_softmax

    return selective_log_softmax(logits, tokens)


def token_entropy(logits):
    """[B, T] entropy (nats) of the full-vocabulary distribution at each position."""
    from trl.trainer.utils import entropy_from_logits

    return entropy_from_logits(logits)


def pad_responses(rows: Sequence[Sequence[int]], pad: int):
    """([B, T] right-padded tokens, [B, T] bool mask) of variable-length responses."""
    import torch

    T = max((len(r) for r in rows), default=0) or 1
    out = torch.full((len(rows), T), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(list(r))
    mask = torch.arange(T)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
    return out, mask


# ------------------------------------------------------------------ engines
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
    native) has 0 in every row."""

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


class HFGenerator(Generator):
    """`model.generate`: every row stays in the batch until the batch's last row ends."""

    name = "hf"

    def generate(self, model, tokenizer, enc, sampling, *, logits_processors=(),
                 stopping_criteria=(), suppress_pad=True, keep_logits=False) -> Generated:
        import torch

        made = generate(model, tokenizer, enc, sampling, logits_processors=logits_processors,
                        stopping_criteria=stopping_criteria, suppress_pad=suppress_pad,
                        output_logits=keep_logits)
        out = made.sequences
        P = enc["input_ids"].shape[1]
        steps = out.shape[1] - P
        logits = None
        if keep_logits:  # model.generate's raw logits (before every processor) / temperature
            temp = 1.0 if sampling.greedy else sampling.temperature
            logits = torch.stack(made.logits, 1).float() / (temp + 1e-7)
        return Generated(sequences=out, prompt_len=P, forwards=steps,
                         token_forwards=out.shape[0] * (P + max(steps - 1, 0)),
                         batch_sizes=[out.shape[0]] * steps, logits=logits)


class NativeGenerator(Generator):
    """Our decode loop (pipeline/engine.py): stopped rows leave the batch; log-probs returned."""

    name = "native"
    has_logprobs = True

    def generate(self, model, tokenizer, enc, sampling, *, logits_processors=(),
                 stopping_criteria=(), suppress_pad=True, keep_logits=False) -> Generated:
        from rlhf.pipeline.engine import native_generate

        return native_generate(model, tokenizer, enc, sampling,
                               logits_processors=logits_processors,
                               stopping_criteria=stopping_criteria, suppress_pad=suppress_pad,
                               keep_logits=keep_logits)


ENGINES = ("hf", "native", "static", "vllm")


def get_generator(name: str) -> Generator:
    """The engine called `name` (one of ENGINES); a one-line error otherwise."""
    from rlhf.pipeline.config import ConfigError

    if name == "hf":
        return HFGenerator()
    if name == "native":
        return NativeGenerator()
    if name == "static":
        from rlhf.pipeline.decode.static import StaticGenerator

        return StaticGenerator()
    if name == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise ConfigError("engine 'vllm' needs vLLM, which is not installed (GPU machines "
                              "only: the `gpu` extra, pip install -e '.[gpu]', plus vllm)") from None
        raise ConfigError("engine 'vllm' is not built yet; use 'native' or 'hf'")
    raise ConfigError(f"unknown engine {name!r}; engines: {', '.join(ENGINES)}")
