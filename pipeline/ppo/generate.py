"""PPO's generation phase: one batch of prompts -> a `Rollout`, through pipeline/decode/ (left
padding, the cut at eos, full-vocabulary log-probs, drafting), with the generation hooks' logits
processors and stopping criteria, the seed's timeout fallback, and the forward passes that give
old / reference log-probs, entropy and the exact KL.

    python -c "from rlhf.pipeline.ppo.generate import FALLBACK_RESPONSE; print(FALLBACK_RESPONSE)"
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch
from rlhf.pipeline.decode import (
    Generator,
    Sampling,
    cut_at_eos,
    encode_prompts,
    get_drafter,
    get_generator,
    pad_responses,
    resolve_engine,
    full_kl,
    response_logits,
    token_entropy,
    token_logprobs,
)
from rlhf.pipeline.ppo import core
from rlhf.pipeline.ppo.rollout import Rollout
from rlhf.pipeline.models.text import response_of

FALLBACK_RESPONSE = "..."  # seed 000 §4.3: a timed-out rollout becomes prompt + "..."


def sampling_of(cfg) -> Sampling:
    """PPO's sampling settings (ppo.temperature / top_p / max_new_tokens), the one place."""
    return Sampling(cfg.temperature, cfg.top_p, cfg.max_new_tokens)


def engine_resolved(cfg, device):
    """`cfg` with `ppo.engine: auto` resolved for `device` (decode.resolve_engine): the trainer
    samples with, and records (trainer_state.json, params_hash), the engine it resolved to; any
    other engine returns `cfg` itself. Drafts on an engine `auto` made other than native are a
    one-line error."""
    from rlhf.pipeline.config import ConfigError

    engine = resolve_engine(cfg.engine, device)
    if engine == cfg.engine:
        return cfg
    if cfg.draft != "none" and engine != "native":
        raise ConfigError(f"ppo.draft {cfg.draft!r} needs the native engine; ppo.engine: auto "
                          f"is {engine!r} on {device}")
    return dataclasses.replace(cfg, engine=engine)


def generator_of(cfg, hooks=()) -> Generator:
    """The engine a PPO step samples with (`ppo.engine`), drafting (`ppo.draft`) with the drafter
    a generation hook holds (features/drafts.py: its state carries across steps and
    checkpoints), else a fresh one."""
    held = [h.drafter for h in hooks if getattr(h, "drafter", None) is not None]
    drafter = held[0] if held else get_drafter(cfg.draft, cfg.draft_layers)
    return get_generator(cfg.engine, draft=drafter, draft_k=cfg.draft_k)


@torch.no_grad()
def generate_rollout(model, tok, batch: list[tuple[str, str]], cfg, version: str, device,
                     hooks=(), step: int = 0, on_error=lambda exc: None, cost=None) -> Rollout:
    """Sample one response per (prompt_id, text) through `generator_of(cfg, hooks)`; rows that
    timed out unfinished or failed become the fallback response with `valid=False` (no
    gradient, no score). `cost` (accounting.StepCost): the generation's forwards and
    token-forwards are added to it (and `draft_off_for_hooks` when a hook's per-token processors
    or criteria made a drafting engine decode plain)."""
    from transformers import MaxTimeCriteria

    cfg = engine_resolved(cfg, device)  # the trainer's cfg is resolved already: itself
    engine = generator_of(cfg, hooks)
    made = None
    ids, texts = [b[0] for b in batch], [b[1] for b in batch]
    enc = encode_prompts(tok, texts, cfg.max_prompt_tokens).to(device)
    flags: list[list[str]] = [[] for _ in texts]
    processors, stops = [], [MaxTimeCriteria(cfg.generation_timeout_s)]
    for h in hooks:
        h.prepare(batch)  # in the GenerationHook protocol (HookBase: a no-op)
        p, s = h.processors(step, len(texts))
        processors += p
        stops += s
    started = time.monotonic()
    try:
        with rollout_dropout(model, cfg):
            made = engine.generate(model, tok, enc, sampling_of(cfg),
                                   logits_processors=processors, stopping_criteria=stops,
                                   keep_logits=cfg.kl_estimator == "full" and engine.has_logprobs)
        gen = made.tokens.cpu().tolist()
        drafted, accepted = made.row_drafted, made.row_accepted
        if cost is not None:
            cost.add_engine(made)
        timed_out = time.monotonic() - started > cfg.generation_timeout_s
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:  # OOM and friends (§4.3)
        gen, timed_out = [[] for _ in texts], False
        drafted, accepted = [0] * len(texts), [0] * len(texts)
        for f in flags:
            f.append("generation_error")
        on_error(exc)
    pad, eos = tok.pad_token_id, tok.eos_token_id
    fallback = tok(FALLBACK_RESPONSE, add_special_tokens=False)["input_ids"] or [eos]
    responses, valid, generated = [], [], []
    for i, g in enumerate(gen):
        stopped = eos in g
        g = cut_at_eos(g, eos, pad)
        generated.append(len(g))  # what the policy spent, whatever happens to the sample
        unfinished = not stopped and len(g) < cfg.max_new_tokens
        if not g or flags[i] or (timed_out and unfinished):
            flags[i].append("timeout" if timed_out else "fallback")
            g = list(fallback)
            valid.append(False)
        else:
            if not stopped:
                flags[i].append("no_eos")
            valid.append(True)
        responses.append(g)
    resp, resp_mask = pad_responses(responses, pad)
    # the scorer sees the response as every other stage cut it (pipeline/models/text.py)
    texts_out = [FALLBACK_RESPONSE if not v
                 else response_of(tok.decode(g, skip_special_tokens=True))
                 for g, v in zip(responses, valid)]
    r = Rollout(prompt_ids=ids, prompts=texts, responses=texts_out, query=enc["input_ids"],
                query_mask=enc["attention_mask"], response=resp.to(device),
                response_mask=resp_mask.to(device), valid=torch.tensor(valid, device=device),
                flags=flags, policy_version=version,
                # per row, what its generation cost, whatever happens to the sample (a fallback
                # row keeps the tokens and drafts it spent): the rollout rows' columns
                extras={"generated_tokens": generated, "drafted": drafted, "accepted": accepted})
    attach_sampled(r, made, cfg)
    if made is not None and made.sampled_logprobs is not None:  # what reuse drafts store
        slp = made.sampled_logprobs.cpu().tolist()
        r.extras["sampled_logprobs"] = [slp[i][: len(g)] if v else None
                                        for i, (g, v) in enumerate(zip(responses, valid))]
    for h in hooks:
        h.finish(r)
    return r


def attach_sampled(r: Rollout, made, cfg) -> None:
    """Keep the engine's per-token old log-probs (entropy, logits) in `r.extras["sampled"]`
    when they are the trainer's old-log-prob pass: the engine returned them, dropout was off
    while sampling (the pass runs the policy in eval mode) and every row is its own sample (a
    fallback row's tokens were never sampled). `forward_logprobs` then skips that pass, unless a
    hook has changed the responses since (it compares them)."""
    if made is None or made.logprobs is None or cfg.rollout_dropout_on or not bool(r.valid.all()):
        return
    T = r.response.shape[1]
    dev, m = r.response.device, r.response_mask
    out = {"logprobs": made.logprobs[:, :T].to(dev) * m, "entropy": made.entropy[:, :T].to(dev) * m}
    out["response"], out["response_mask"] = r.response.clone(), m.clone()
    if made.logits is not None:
        out["logits"] = made.logits[:, :T].to(dev)
    r.extras["sampled"] = out


def rollout_dropout(model, cfg):
    """Seed 001 §5.2: optionally keep dropout active while sampling (off by default)."""
    if not cfg.rollout_dropout_on:
        model.eval()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def active():
        saved = []
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                saved.append((m, "p", m.p))
                m.p = cfg.rollout_dropout
            elif isinstance(getattr(m, "attention_dropout", None), float):
                saved.append((m, "attention_dropout", m.attention_dropout))
                m.attention_dropout = cfg.rollout_dropout
        model.train()
        try:
            yield
        finally:
            for m, name, value in saved:
                setattr(m, name, value)
            model.eval()
    return active()


def policy_logits(model, r: Rollout, temperature: float, idx: torch.Tensor | None = None):
    """[b, T, V] response-token logits / temperature of rows `idx` (all rows: None)."""
    q, qm, resp, rm = r.query, r.query_mask, r.response, r.response_mask
    if idx is not None:
        q, qm, resp, rm = q[idx], qm[idx], resp[idx], rm[idx]
    return response_logits(model, q, qm, resp, rm, temperature)


@torch.no_grad()
def forward_logprobs(policy, ref, r: Rollout, cfg, cost=None, guard=None) -> None:
    """Old and reference log-probs, entropy and per-token KL, all from full distributions.
    `cost`: the two passes' token-forwards are added to it. `guard`
    (decode/logprob_guard.LogprobGuard): checks the engine's log-probs before they are reused."""
    sampled = r.extras.pop("sampled", None)
    if sampled is not None and cfg.kl_estimator == "full" and "logits" not in sampled:
        sampled = None  # the exact KL needs the policy's full distributions
    if sampled is not None and not (torch.equal(sampled["response"], r.response)
                                    and torch.equal(sampled["response_mask"], r.response_mask)):
        sampled = None  # a hook rewrote responses after sampling (resampling, truncation)
    if sampled is not None and guard is not None and guard.due():
        sampled = guarded(policy, r, cfg, sampled, guard, cost)
    positions = r.query.shape[0] * (r.query.shape[1] + r.response.shape[1])
    ref_logits = policy_logits(ref, r, cfg.temperature)
    if sampled is None:
        logits = policy_logits(policy, r, cfg.temperature)
        r.logprobs, r.entropy = token_logprobs(logits, r.response), token_entropy(logits)
    else:  # the engine's sampled distribution is this pass (tests/test_engine.py: within 1e-4)
        logits = sampled.get("logits")
        r.logprobs, r.entropy = sampled["logprobs"], sampled["entropy"]
    if cost is not None:
        if sampled is None:
            cost.logprob_token_forwards += positions
        else:
            cost.logprob_passes_saved += 1
        cost.ref_token_forwards += positions
    if logits is not None:
        core.check_full_distribution(torch.log_softmax(logits[:1], -1), logits.shape[-1])
    r.ref_logprobs = token_logprobs(ref_logits, r.response)
    if cfg.kl_estimator == "full":
        kl = full_kl(logits, ref_logits)  # §5.4: exact, over the whole vocabulary
    else:
        kl = core.kl_estimate(r.logprobs, r.ref_logprobs, cfg.kl_estimator)
    r.kl = kl * r.response_mask


def guarded(policy, r: Rollout, cfg, sampled: dict, guard, cost=None) -> dict | None:
    """The engine's `sampled` log-probs if the guard's check on a sample of rows passes, else
    None (the trainer's own pass runs), with a warning and `logprob_guard_failures` counted."""
    import warnings

    from rlhf.pipeline.decode import LogprobMismatch

    idx = guard.pick(r.response.shape[0]).to(r.response.device)
    mine = token_logprobs(policy_logits(policy, r, cfg.temperature, idx), r.response[idx])
    check = guard.compare(sampled["logprobs"][idx], mine, r.response_mask[idx])
    if cost is not None:
        cost.count("logprob_guard_checks")
        cost.logprob_token_forwards += len(idx) * (r.query.shape[1] + r.response.shape[1])
    if check.ok:
        return sampled
    if cost is not None:
        cost.count("logprob_guard_failures")
    warnings.warn(f"engine log-probs differ from the trainer's forward (max |delta log p| "
                  f"{check.max:.2e} > {guard.tol:.0e}, mean {check.mean:.2e} on {check.rows} rows): "
                  "the old-log-prob pass runs", LogprobMismatch, stacklevel=3)
    return None
