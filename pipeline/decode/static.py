"""The static rollout engine (`engine: static`): a decode step whose shapes never change, so
that on CUDA it is captured once per batch bucket as a CUDA graph and replayed.

The step (one forward of the model's own modules over a transformers `StaticCache`, then the
on-device sampling of pipeline/decode/static_sample.py) runs on S slots, S a bucket size:
the batch itself, then powers of two below it. Per step nothing leaves the device: the KV cache
is preallocated once for the prompt and the response budget and written in place (column
P + t for every slot), the attention mask is a [S, L] buffer whose column opens in place, a
stopped row keeps its slot (it is fed the fill token and its outputs are masked to fill / 0) and
its stop is a device-side mask. Every `check_every` steps (k) the host reads that mask once
(one sync): all rows stopped ends the loop, the generation time-out (a `MaxTimeCriteria` among
the criteria) is checked, and when the live rows fit the next smaller power of two the live
slots move to that bucket (one `index_select` of the cache; the distinct shapes are at most
1 + log2(batch)). A row that stops waits at most k steps for the host to see it
(`StaticStats.max_wait`).

Which models get it: a model whose class declares `_can_compile_fullgraph` and whose static
cache has only full-attention `StaticLayer`s (a sliding-window layer keeps host-side state that
a replayed graph would not update), in eval mode. Any other model goes through the native
engine (pipeline/decode/native.py), exact as before: `static_path(model)` says which.

Caller logits processors and stopping criteria (the generation hooks) still work: the graph
then holds the forward only, and the processors and criteria run eagerly between it and the
sampling, on the full batch ([B, P + t] ids, [B, V] scores by original row), like the native
engine's.

    python -c "from rlhf.pipeline.decode import static_path; help(static_path)"
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from rlhf.pipeline.decode.static_sample import StepSampling, sample_step, suppress
from rlhf.pipeline.decode.protocol import Generated, Generator
from rlhf.pipeline.decode.sampling import Sampling
from rlhf.pipeline.decode.tokens import position_ids

CHECK_EVERY = 8  # k: steps between the host's looks at the stop mask (the default of the engine)


def static_path(model) -> str:
    """"static" when the static step runs `model`, else "native" (the exact fallback) and why."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    if model.training:
        return "native: model in training mode (rollout dropout)"
    if not getattr(model, "_can_compile_fullgraph", False):
        return f"native: {type(model).__name__} does not support a static cache"
    cache = StaticCache(config=model.config, max_cache_len=8)
    if any(type(layer) is not StaticLayer for layer in cache.layers):
        return "native: sliding-window or hybrid cache layers keep host-side state"
    return "static"


@dataclass
class StaticStats:
    """What one generation's loop did (bench/engine.py reports it)."""

    steps: int = 0            # decode steps (forwards after the prefill)
    host_syncs: int = 0       # times the host read device state inside the loop
    shapes: list = field(default_factory=list)   # bucket sizes used, in order
    captures: int = 0         # CUDA graphs captured (0 on a CPU: eager)
    max_wait: int = 0         # most steps a stopped row waited for the host to see it
    dead_slot_steps: int = 0  # slot-steps computed for rows that had stopped
    capture_error: str | None = None  # why a CUDA graph could not be captured (then eager)


class _Bucket:
    """The static state of S slots: the cache, the step's input buffers, its CUDA graph."""

    def __init__(self, model, S: int, L: int, device):
        from transformers import StaticCache

        self.S, self.L = S, L
        self.cache = StaticCache(config=model.config, max_cache_len=L)
        self.tok = torch.zeros(S, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(S, 1, dtype=torch.long, device=device)
        self.mask = torch.zeros(S, L, dtype=torch.long, device=device)
        self.col = torch.zeros((), dtype=torch.long, device=device)   # the column written next
        self.step = torch.zeros((), dtype=torch.long, device=device)  # the response index t
        self.rows = torch.arange(S, device=device)       # the original row of each slot
        self.done = torch.zeros(S, dtype=torch.bool, device=device)
        self.graph, self.outputs = None, None

    def adopt(self, src: _Bucket, keep: torch.Tensor) -> None:
        """Take the slots `keep` of `src` (the compaction to this smaller bucket)."""
        for dst_l, src_l in zip(self.cache.layers, src.cache.layers):
            if not dst_l.is_initialized:
                dst_l.lazy_initialization(src_l.keys[: self.S], src_l.values[: self.S])
            dst_l.keys.copy_(src_l.keys.index_select(0, keep))
            dst_l.values.copy_(src_l.values.index_select(0, keep))
            dst_l.cumulative_length.copy_(src_l.cumulative_length)
        for name in ("tok", "pos", "mask", "rows", "done"):
            getattr(self, name).copy_(getattr(src, name).index_select(0, keep))
        self.col.copy_(src.col)
        self.step.copy_(src.step)


class _Run:
    """One generation: the output buffers by original row, the buckets, the step."""

    def __init__(self, model, enc, sampling: Sampling, s: StepSampling, processors, criteria,
                 check_every: int, keep_logits: bool = False):
        self.model, self.s, self.k = model, s, check_every
        self.processors, self.criteria = list(processors), []
        self.deadline = None
        from transformers import MaxTimeCriteria

        for c in criteria:  # the time-out is the host's every k steps; the rest run per step
            if isinstance(c, MaxTimeCriteria):
                end = c.initial_timestamp + c.max_time
                self.deadline = end if self.deadline is None else min(self.deadline, end)
            else:
                self.criteria.append(c)
        self.ids, self.mask = enc["input_ids"], enc["attention_mask"]
        self.B, self.P = self.ids.shape
        self.T = sampling.max_new_tokens
        dev = self.dev = self.ids.device
        self.out = torch.full((self.B, self.T), s.fill, dtype=torch.long, device=dev)
        self.lps = torch.zeros(3, self.B, self.T, device=dev)  # sampled, full, entropy
        self.stop_at = torch.full((self.B,), self.T, dtype=torch.long, device=dev)
        self.graphs = dev.type == "cuda"
        self.stats = StaticStats()
        self.sizes: list[int] = []  # slots of each decode step
        self.kept = (torch.zeros(self.B, self.T, model.config.get_text_config().vocab_size,
                                 device=dev) if keep_logits else None)
        self.t = 0                 # tokens drawn so far (the host's copy of `_Bucket.step`)
        self.seen: set[int] = set()  # rows the host has seen stopped
        self.dead = torch.zeros((), dtype=torch.long, device=dev)  # slot-steps of stopped rows

    # ---------------------------------------------------------------- the step
    def _forward(self, b: _Bucket) -> torch.Tensor:
        b.mask.scatter_(1, b.col.view(1, 1).expand(b.S, 1), 1)
        logits = self.model(input_ids=b.tok, attention_mask=b.mask, position_ids=b.pos,
                            cache=b.cache, use_cache=True).logits[:, -1]
        b.col.add_(1)
        b.pos.add_(1)
        return logits.float()

    def _sample(self, b: _Bucket, raw: torch.Tensor) -> None:
        scores = suppress(raw, self.s)
        if self.processors or self.criteria:
            scores = self._hooks(b, scores)
        tok, lp_s, lp_f, ent, now = sample_step(raw, scores, b.done, self.s)
        t = b.step.expand(b.S)
        self.out.index_put_((b.rows, t), tok)
        for i, v in enumerate((lp_s, lp_f, ent)):
            self.lps[i].index_put_((b.rows, t), v)
        self.dead.add_(b.done.sum())
        if self.kept is not None:  # raw / temperature, what a full-vocabulary KL needs
            self.kept.index_put_((b.rows, t), raw / (self.s.temperature + 1e-7))
        newly = now & ~b.done
        self.stop_at.index_put_((b.rows,), torch.where(newly, t, self.stop_at[b.rows]))
        b.done.copy_(now)
        b.tok.copy_(tok[:, None])
        b.step.add_(1)

    def _hooks(self, b: _Bucket, scores: torch.Tensor) -> torch.Tensor:
        """The caller's processors, on the full batch by original row ([B, P + t] ids, [B, V]
        scores, zeros for a row without a slot): eager, with host syncs."""
        self._seq = torch.cat([self.ids, self.out[:, : self.t]], 1)
        full = torch.zeros(self.B, scores.shape[-1], device=self.dev)
        full[b.rows] = scores
        for p in self.processors:
            full = p(self._seq, full)
        self._scores = full
        return full[b.rows]

    def _criteria(self, b: _Bucket) -> None:
        """Per-row stopping criteria on the ids after this step's token (eager)."""
        if not self.criteria:
            return
        seq = torch.cat([self.ids, self.out[:, : self.t + 1]], 1)  # with this step's token
        stop = torch.zeros(self.B, dtype=torch.bool, device=self.dev)
        for c in self.criteria:
            stop |= torch.as_tensor(c(seq, self._scores), device=self.dev).expand(self.B).bool()
        now = b.done | stop[b.rows]
        t = (b.step - 1).expand(b.S)
        self.stop_at.index_put_((b.rows,), torch.where(now & ~b.done, t, self.stop_at[b.rows]))
        b.done.copy_(now)

    def _graphed(self, b: _Bucket):
        """The step on `b`: eager on a CPU; on CUDA its graph, captured at the bucket's first
        step (that step runs eagerly on a side stream, which also warms the kernels up)."""
        hooks = bool(self.processors or self.criteria)
        body = (lambda: self._forward(b)) if hooks else (lambda: self._sample(b, self._forward(b)))
        if not self.graphs:
            out = body()
        elif b.graph is None:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                out = body()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):  # records the step's kernels without running them
                    b.outputs = body()
            except RuntimeError as exc:  # a host sync inside the model's forward: stay eager
                self.graphs = False
                self.stats.capture_error = str(exc).splitlines()[0][:200]
            else:
                b.graph = graph
                self.stats.captures += 1
        else:
            b.graph.replay()
            out = b.outputs
        if hooks:
            self._sample(b, out)
            self._criteria(b)

    # ---------------------------------------------------------------- the loop
    def prefill(self) -> _Bucket:
        """The prompt forward into the first bucket's static cache, and token 0 drawn."""
        b = _Bucket(self.model, self.B, self.P + self.T, self.dev)
        b.mask[:, : self.P] = self.mask
        keep1 = {"logits_to_keep": 1} if getattr(self.model, "_supports_logits_to_keep",
                                                 lambda: False)() else {}
        raw = self.model(input_ids=self.ids, attention_mask=b.mask[:, : self.P],
                         position_ids=position_ids(self.mask), cache=b.cache, use_cache=True,
                         **keep1).logits[:, -1].float()
        b.pos.copy_(self.mask.sum(1, keepdim=True))
        b.col.fill_(self.P)
        self.step(b, raw)
        return b

    def step(self, b: _Bucket, raw: torch.Tensor | None = None) -> None:
        """One token for every slot: the prefill's logits, else a (graphed) decode step."""
        if raw is None:
            self._graphed(b)
            self.stats.steps += 1
            self.sizes.append(b.S)
        else:
            self._sample(b, raw)
            self._criteria(b)
        self.t += 1

    def check(self, b: _Bucket) -> tuple[bool, _Bucket]:
        """The host's look every k steps (one sync): (stop now, the bucket to go on in)."""
        self.stats.host_syncs += 1
        done, stop_at = b.done.tolist(), self.stop_at.tolist()
        for r, d in zip(b.rows.tolist(), done):
            if d and r not in self.seen:
                self.seen.add(r)
                self.stats.max_wait = max(self.stats.max_wait, self.t - 1 - stop_at[r])
        live = [i for i, d in enumerate(done) if not d]
        if not live or (self.deadline is not None and time.time() > self.deadline):
            return True, b
        size = 1 << (len(live) - 1).bit_length()  # the next power of two >= the live rows
        if size >= b.S:
            return False, b
        dead = [i for i, d in enumerate(done) if d]
        keep = torch.tensor(live + dead[: size - len(live)], device=self.dev)
        small = _Bucket(self.model, size, b.L, self.dev)
        small.adopt(b, keep)
        self.stats.shapes.append(size)
        return False, small

    def run(self) -> Generated:
        b = self.prefill()
        self.stats.shapes.append(b.S)
        since = 0
        while self.t < self.T:
            if since == self.k:
                since = 0
                stop, b = self.check(b)
                if stop:
                    break
            self.step(b)
            since += 1
        return self.result(b)

    def result(self, b: _Bucket) -> Generated:
        """The batch's `Generated`, cut after the last step any row was live in."""
        self.stats.host_syncs += 1  # the read-out
        stop_at = self.stop_at.tolist()
        T = self.t if any(s >= self.t for s in stop_at) else max(stop_at) + 1
        self.stats.dead_slot_steps = int(self.dead)
        sizes = [self.B] + self.sizes
        return Generated(sequences=torch.cat([self.ids, self.out[:, :T]], 1), prompt_len=self.P,
                         forwards=len(sizes), token_forwards=self.B * self.P + sum(sizes[1:]),
                         batch_sizes=sizes, sampled_logprobs=self.lps[0, :, :T],
                         logprobs=self.lps[1, :, :T], entropy=self.lps[2, :, :T],
                         logits=None if self.kept is None else self.kept[:, :T])


class StaticGenerator(Generator):
    """`engine: static`: the static step where `static_path` allows, else the native engine.
    `last_path` / `last_stats` say what the last batch got (bench/engine.py, the tests)."""

    name = "static"
    has_logprobs = True

    def __init__(self, check_every: int = CHECK_EVERY):
        if check_every < 1:
            from rlhf.pipeline.config import ConfigError

            raise ConfigError(f"the static engine's check_every must be >= 1, got {check_every}")
        self.check_every = check_every
        self.last_path, self.last_stats = None, None

    @torch.no_grad()
    def generate(self, model, tokenizer, enc, sampling, *, logits_processors=(),
                 stopping_criteria=(), suppress_pad=True, keep_logits=False) -> Generated:
        self.last_path = static_path(model)
        if self.last_path != "static":
            from rlhf.pipeline.decode.native import native_generate

            self.last_stats = None
            return native_generate(model, tokenizer, enc, sampling,
                                   logits_processors=logits_processors,
                                   stopping_criteria=stopping_criteria, suppress_pad=suppress_pad,
                                   keep_logits=keep_logits)
        run = _Run(model, enc, sampling, StepSampling.of(sampling, tokenizer, suppress_pad),
                   logits_processors, stopping_criteria, self.check_every, keep_logits)
        made = run.run()
        self.last_stats = run.stats
        return made
