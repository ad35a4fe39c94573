"""The scorer interface PPO and eval read rewards from, and its adapter for a transformers RM.

A scorer is any object with `score(prompts, responses) -> (rewards [B], confidence [B])`
(tensors or sequences of floats), or `(rewards, confidence, valid [B] bool)` when it may decline
to score a row (a reward function or server: code_rewards.py; a declined row earns nothing). It
may also offer `token_scores(prompts, responses, n_tokens) -> list[(prompt_score, [score after
each response token])]`, the per-position RM attribution the light critic's reward-aware
attention uses (seed 000 §3.2; see pipeline/ppo/critic.py): prefix scores of a decoder RM,
gradient x input attributions of an encoder RM. The reward stage builds the light RM; `HFScorer`
wraps any AutoModelForSequenceClassification checkpoint.

What the `rm_scores` table records of a scorer (`scorer_identity`): its `name` (light_rm,
strong_rm, ...), its `version` (`store.hashing.tree_hash` of the folder it was loaded from,
computed once by `load_scorer`; a reward function's or server's spec, code_rewards.py) and its
`gate`, the confidence below which a score is queued for RM fine-tuning (seed 000 §3.4: the
reward stage's scorer.json, else 0.6).

    python -c "from rlhf.pipeline.models.scoring import HFScorer; s = HFScorer.load('artifacts/models/rm_light'); print(s.score(['hi'], ['hello']))"
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from rlhf.pipeline.models.text import encode_kwargs, render_prompt, render_sample, response_offset


@runtime_checkable
class Scorer(Protocol):
    def score(self, prompts: list[str], responses: list[str]): ...


def text_format():
    """(format_prompt, format_sample, response_of) from pipeline/models/text.py (the reward helper's
    contract), or plain concatenation when that module is not there."""
    try:
        from rlhf.pipeline.models.text import format_prompt, format_sample, response_of
    except ImportError:
        def format_prompt(prompt: str) -> str:
            return prompt

        def format_sample(prompt: str, response: str) -> str:
            return f"{prompt} {response}"

        def response_of(generated: str) -> str:
            return generated
    return format_prompt, format_sample, response_of


def scorer_identity(scorer) -> tuple[str, str, float]:
    """(name, version, gate) of any scorer; "unversioned" when it was not loaded from a folder."""
    from rlhf.pipeline.reward.confidence import CONFIDENCE_GATE

    gate = getattr(scorer, "gate", None)
    return (getattr(scorer, "name", "light_rm"), getattr(scorer, "version", None) or "unversioned",
            CONFIDENCE_GATE if gate is None else float(gate))


class HFScorer:
    """A sequence-classification RM as a scorer. Confidence is 1.0: a single RM has no estimate
    of its own uncertainty (the reward stage's ensemble scorer supplies a real one)."""

    name = "light_rm"
    version: str | None = None

    def __init__(self, model, tokenizer, max_length: int = 512):
        self.model, self.tokenizer, self.max_length = model.eval(), tokenizer, max_length

    @classmethod
    def load(cls, path: str, compute=None) -> HFScorer:
        """The RM at `path`, in `compute`'s device and dtype (None: as the folder saved it, on
        the CPU)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        if compute is None:
            return cls(AutoModelForSequenceClassification.from_pretrained(path), tok)
        from rlhf.pipeline.models.compute import load_pretrained

        return cls(load_pretrained(AutoModelForSequenceClassification, path, compute,
                                   "reward model"), tok)

    def _encode(self, prompts: list[str], responses: list[str]):
        """Right-padded encodings of the texts the RM scores (`text.render_sample`)."""
        tok = self.tokenizer
        tok.padding_side = "right"
        return tok([render_sample(p, r, tok) for p, r in zip(prompts, responses)],
                   return_tensors="pt", padding=True, truncation=True, max_length=self.max_length,
                   **encode_kwargs(tok))

    @torch.no_grad()
    def score(self, prompts: list[str], responses: list[str]):
        enc = self._encode(prompts, responses)
        if self.model.device.type != "cpu":  # params.yaml `compute`: the RM's GPU
            enc = enc.to(self.model.device)
        logits = self.model(**enc).logits[:, 0].float()
        return logits, torch.ones_like(logits)

    def token_scores(self, prompts: list[str], responses: list[str], n_tokens: list[int]):
        """Per-position scores for the prompt end and each of `n_tokens[i]` policy tokens.

        A decoder RM with a per-token `score` head (Llama-style) gives prefix scores: the head
        applied to every hidden state, what the RM would say if the text ended there. Any other
        RM (an encoder such as MiniLM/BERT, which pools one token and reads the text both ways)
        gives gradient x input attributions instead (`attribution_scores`). Either way the RM's
        own tokens of the response are mapped onto the policy's proportionally (they coincide
        when both share the tokenizer).
        """
        if has_token_head(self.model):
            return self._prefix_scores(prompts, responses, n_tokens)
        return attribution_scores(self.model, self.tokenizer, prompts, responses, n_tokens,
                                  self.max_length)

    @torch.no_grad()
    def _prefix_scores(self, prompts: list[str], responses: list[str], n_tokens: list[int]):
        enc = self._encode(prompts, responses)
        base = getattr(self.model, self.model.base_model_prefix)
        hidden = base(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])[0]
        per_pos = self.model.score(hidden)[..., 0].float()  # [B, L]
        special = {"add_special_tokens": True, **encode_kwargs(self.tokenizer)}
        out = []
        for i, (p, n) in enumerate(zip(prompts, n_tokens)):
            length = int(enc["attention_mask"][i].sum())
            n_prompt = len(self.tokenizer(render_prompt(p, self.tokenizer), **special)
                           ["input_ids"])
            n_prompt = min(max(n_prompt, 1), length)
            prompt_score = float(per_pos[i, n_prompt - 1])
            resp = per_pos[i, n_prompt:length].tolist() or [prompt_score]
            mapped = [resp[min(len(resp) - 1, (j * len(resp)) // max(n, 1))] for j in range(n)]
            out.append((prompt_score, mapped))
        return out


def has_token_head(model) -> bool:
    """A decoder RM whose `score` head maps every hidden state to a score (Llama-style)."""
    return hasattr(model, "score")


def can_attribute(model, tokenizer) -> bool:
    """Whether `HFScorer.token_scores` works for this RM: a per-token head, or input embeddings
    and a fast tokenizer (character offsets) for the attribution path."""
    return has_token_head(model) or (getattr(tokenizer, "is_fast", False)
                                     and model.get_input_embeddings() is not None)


def _spread(n_chars: int, spans: list[tuple[int, int, float]], n: int) -> list[float]:
    """Attributions of character spans [(start, end, value)] of a text of `n_chars` characters,
    spread uniformly over their characters and summed over `n` equal slices of the text."""
    per_char = [0.0] * n_chars
    for start, end, value in spans:
        start, end = max(start, 0), min(end, n_chars)
        if end > start:
            for c in range(start, end):
                per_char[c] += value / (end - start)
    if n_chars == 0:
        return [0.0] * n
    return [sum(per_char[(j * n_chars) // n:((j + 1) * n_chars) // n]) for j in range(n)]


def attribution_scores(model, tokenizer, prompts: list[str], responses: list[str],
                       n_tokens: list[int], max_length: int = 512):
    """Per-position scores of any RM from gradient x input attributions (one backward pass).

    a_t = <d score / d e_t, e_t> for the input embedding e_t of each RM token (the first-order
    share of the score each token carries). The response's attributions, per character, are
    summed over `n_tokens[i]` equal slices of the response text (one per policy token), and the
    per-position scores are the running sum on top of `score - sum(response attributions)`, so
    increments are the attributions and the last position is the sequence's score, as with a
    decoder's prefix scores. Texts are left-truncated to `max_length` as
    `reward.scorer.encode_texts` does (`kept_positions`).
    """
    from rlhf.pipeline.reward.scorer import kept_positions

    texts = [render_sample(p, r, tokenizer) for p, r in zip(prompts, responses)]
    starts = [response_offset(p, tokenizer) for p in prompts]
    enc = tokenizer(texts, **{"add_special_tokens": True, **encode_kwargs(tokenizer)},
                    return_offsets_mapping=True)
    special = set(tokenizer.all_special_ids)
    rows, offsets = [], []
    for ids, offs in zip(enc["input_ids"], enc["offset_mapping"]):
        keep = kept_positions(ids, max_length, special)
        rows.append([ids[k] for k in keep])
        offsets.append([offs[k] for k in keep])
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    x = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, r in enumerate(rows):
        x[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    emb = model.get_input_embeddings()(x).detach().requires_grad_(True)
    with torch.enable_grad():
        score = model(inputs_embeds=emb, attention_mask=mask).logits[:, 0].float()
        (grad,) = torch.autograd.grad(score.sum(), emb)
    attr = (grad * emb).sum(-1).detach() * mask  # [B, L]
    score = score.detach()
    out = []
    for i, n in enumerate(n_tokens):
        resp_start, n_chars = starts[i], len(texts[i]) - starts[i]
        spans = [(a - resp_start, b - resp_start, float(attr[i, t]))
                 for t, (a, b) in enumerate(offsets[i]) if b > a and b > resp_start]
        per_token = _spread(n_chars, spans, n)
        base = float(score[i]) - sum(per_token)
        running, scores = base, []
        for a in per_token:
            running += a
            scores.append(running)
        out.append((base, scores))
    return out


class RewardStageScorer:
    """The reward stage's scorer (`rlhf.pipeline.reward.load_ensemble`: a callable returning
    baseline-relative rewards and ensemble confidence) under this module's interface.

    A single-member scorer (the light RM) also gets `token_scores`, the per-position attribution
    the light critic's reward-aware attention reads, from the same member through `HFScorer`
    (shifted by the member's reference, so the last position is the sequence's reward).
    """

    name = "light_rm"
    version: str | None = None

    def __init__(self, scorer):
        self.scorer = scorer
        self.gate = getattr(scorer, "gate", None)
        models = getattr(scorer, "models", ())
        # per-position scores: prefix scores of a decoder's per-token head, else gradient x
        # input attributions (an encoder RM such as the MiniLM light RM; see HFScorer)
        if len(models) == 1 and can_attribute(models[0], scorer.tokenizer):
            self._member = HFScorer(scorer.models[0], scorer.tokenizer, scorer.max_length)
            self._reference = float(scorer.references[0])
            self.token_scores = self._token_scores

    def score(self, prompts: list[str], responses: list[str]):
        return self.scorer(list(prompts), list(responses))

    def _token_scores(self, prompts, responses, n_tokens):
        ref = self._reference
        return [(p - ref, [s - ref for s in per])
                for p, per in self._member.token_scores(prompts, responses, n_tokens)]


def load_scorer(path: str | Path, name: str = "light_rm", compute=None, policy_tokenizer=None):
    """The scorer saved at `path`: the reward stage's own (a folder with scorer.json, through
    `rlhf.pipeline.reward.load_ensemble`), else a plain sequence-classification checkpoint; named
    `name` and versioned by the folder's content hash (the `rm_scores` table records both).
    `path` may also be a reward function (`python:file.py:function`) or a reward server
    (`http://host:port/path`), versioned by its spec (code_rewards.py). `compute`: an RM
    folder's device and dtype (pipeline/models/compute.py; None: as before, the CPU).
    `policy_tokenizer`: the policy's, in whose chat template a reward server gets the texts, as
    the policy saw them (None: the plain format; an RM folder renders in its own tokenizer)."""
    from rlhf.pipeline.models import code_rewards
    from rlhf.store.hashing import tree_hash

    if code_rewards.kind(path) != "folder":
        scorer = code_rewards.load(path, policy_tokenizer)
        scorer.name = name
        return scorer
    path = Path(path)
    if (path / "scorer.json").is_file():
        from rlhf.pipeline.reward import load_ensemble

        scorer = RewardStageScorer(load_ensemble(path, compute=compute))
    elif (path / "config.json").is_file():
        scorer = HFScorer.load(str(path), compute)
    else:
        raise FileNotFoundError(f"{path} is not a reward model folder (no scorer.json, no "
                                "config.json)")
    scorer.name, scorer.version = name, tree_hash(path)
    return scorer
