"""What a PPO step costs: tokens, rollouts, reward-model calls and seconds per phase.

The x-axes of the rollout-economy benchmark (bench/economy/) and of every saving claim: a
feature that prunes, replaces or screens samples must still pay for every token the policy
generated. One `StepCost` per step goes into metrics.jsonl, summary.json and `train_metrics`;
`Totals` keeps the run's cumulative sums (checkpointed, so a resumed run counts on exactly).

    python -c "from rlhf.pipeline.ppo.accounting import StepCost; c = StepCost(); \
c.add_generated(48); print(c.as_metrics())"
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

PHASES = ("generate", "score", "logprobs", "critic", "update", "records")


@dataclass
class StepCost:
    """One step's bill (this process; `merged` sums the processes)."""

    tokens_generated: int = 0   # every token the policy sampled: kept, pruned, replaced, screened
    tokens_trained: int = 0     # response tokens that reach the PPO loss (loss mask)
    rollouts_started: int = 0   # sequences generation was started for (resamples included)
    rollouts_trained: int = 0   # rollouts whose tokens reach the update
    rollouts_skipped: int = 0   # started but kept out of the update (fallback, pruned, gated)
    rollouts_replayed: int = 0  # trained rollouts drawn from the replay buffer (features/replay.py;
                                # generated, scored and counted at an earlier step)
    prompts_screened: int = 0   # prompts a prompt gate looked at and did not roll out
    light_rm_calls: int = 0     # texts the light RM scored
    light_rm_tokens: int = 0    # tokens it read
    strong_rm_calls: int = 0
    strong_rm_tokens: int = 0
    human_rm_calls: int = 0     # human-queue labels (the annotator pool)
    human_rm_tokens: int = 0    # (0: an annotator reads, no model does)
    # --- compute, counted (never timed): the x-axes a saving claim may use besides tokens.
    # A token-forward is one token position pushed through a model, padding included (a padded
    # position costs what a real one does); a forward is one sequential call of the model.
    gen_forwards: int = 0           # sequential policy forwards in generation (prefill, decode,
                                    # draft verification)
    gen_token_forwards: int = 0     # token positions they pushed through the policy
    drafted_tokens: int = 0         # tokens a drafter proposed (pipeline/decode)
    accepted_tokens: int = 0        # of those, accepted by the exact verification rule
    draft_forwards: int = 0         # sequential forwards of the draft model (ppo.draft: model)
    draft_token_forwards: int = 0   # token positions through it (its layers: the policy's
                                    # first ppo.draft_layers)
    logprob_token_forwards: int = 0  # policy token-forwards of the old-log-prob pass
    logprob_passes_saved: int = 0   # old-log-prob passes skipped: the engine's sampled
                                    # distribution was reused (0 or 1 a step and process)
    ref_token_forwards: int = 0     # reference-model token-forwards (KL to the reference)
    update_token_forwards: int = 0  # policy token-forwards of the PPO epochs (forward+backward)
    critic_token_forwards: int = 0  # critic token-forwards (values and the epochs)
    # per-feature counters, keyed by the names a feature declares (features/registry.py), e.g.
    # rollouts_pruned; flat in the metrics like the fields above
    features: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    gpu_peak_gib: dict = field(default_factory=dict)  # peak GPU memory per phase (CUDA only)

    def add_generated(self, n_tokens: int, n_sequences: int = 1) -> None:
        self.tokens_generated += int(n_tokens)
        self.rollouts_started += int(n_sequences)

    def add_engine(self, made) -> None:
        """Adds what one engine call (decode.Generated) counted: its sequential policy
        forwards and token-forwards (hf: every row until the batch's last ends; native: a
        stopped row leaves), drafted / accepted tokens and the draft model's forwards, and
        `draft_off_for_hooks` when a drafting engine decoded the batch plain (a generation
        hook's per-token processors or criteria)."""
        self.gen_forwards += made.forwards
        self.gen_token_forwards += made.token_forwards
        self.drafted_tokens += made.drafted
        self.accepted_tokens += made.accepted
        self.draft_forwards += made.draft_forwards
        self.draft_token_forwards += made.draft_token_forwards
        if made.draft_off:
            self.count("draft_off_for_hooks")

    def count(self, name: str, n: int = 1) -> None:
        """Adds `n` to the per-feature counter `name`."""
        self.features[name] = self.features.get(name, 0) + int(n)

    def add_rm(self, tier: str, n_texts: int, n_tokens: int) -> None:
        setattr(self, f"{tier}_rm_calls", getattr(self, f"{tier}_rm_calls") + int(n_texts))
        setattr(self, f"{tier}_rm_tokens", getattr(self, f"{tier}_rm_tokens") + int(n_tokens))

    @contextmanager
    def phase(self, name: str):
        """Adds the wall seconds of the block to phase `name` (one of PHASES)."""
        if name not in self.seconds:
            raise KeyError(f"unknown phase {name!r}; phases: {PHASES}")
        cuda = _cuda()
        if cuda is not None:  # seed 000 §5.2 memory creep: what each phase peaks at
            cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t
            if cuda is not None:
                self.gpu_peak_gib[name] = max(self.gpu_peak_gib.get(name, 0.0),
                                              cuda.max_memory_allocated() / 2**30)

    def counts(self) -> dict[str, int]:
        """Every counter, the fields' and the features' (flat)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_COUNTS}
        out.update(self.features)
        return out

    def as_metrics(self) -> dict[str, float]:
        """Flat metrics: the counts, `seconds_<phase>` for each phase and, on a GPU,
        `gpu_peak_gib_<phase>`."""
        out: dict[str, float] = dict(self.counts())
        out.update({f"seconds_{p}": round(s, 4) for p, s in self.seconds.items()})
        out.update({f"gpu_peak_gib_{p}": round(g, 3) for p, g in self.gpu_peak_gib.items()})
        return out

    @staticmethod
    def merged(parts: list[StepCost]) -> StepCost:
        """The sum over processes (counts add; seconds: the slowest process, as the step waits)."""
        total = StepCost()
        for p in parts:
            for k, v in p.counts().items():
                if k in COUNTERS:
                    setattr(total, k, getattr(total, k) + v)
                else:
                    total.count(k, v)
            for k, s in p.seconds.items():
                total.seconds[k] = max(total.seconds[k], s)
            for k, g in p.gpu_peak_gib.items():
                total.gpu_peak_gib[k] = max(total.gpu_peak_gib.get(k, 0.0), g)
        return total


_NOT_COUNTS = ("seconds", "gpu_peak_gib", "features")
COUNTERS = tuple(f.name for f in fields(StepCost) if f.name not in _NOT_COUNTS)


def _cuda():
    """torch.cuda when a GPU is in use, else None (torch imported only then: the math stays light)."""
    import sys

    torch = sys.modules.get("torch")
    return torch.cuda if torch is not None and torch.cuda.is_available() else None


@dataclass
class Totals:
    """Cumulative counts of a run (`<counter>_cum` in the metrics), part of the checkpoint."""

    sums: dict = field(default_factory=lambda: {k: 0 for k in COUNTERS})
    seconds: float = 0.0

    def add(self, cost: StepCost) -> None:
        for k, v in cost.counts().items():
            self.sums[k] = self.sums.get(k, 0) + v
        self.seconds += sum(cost.seconds.values())

    def as_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {f"{k}_cum": v for k, v in self.sums.items()}
        out["seconds_cum"] = round(self.seconds, 3)
        return out

    def state_dict(self) -> dict:
        """The counts (the checkpoint's trainer_state.json); the seconds are a wall-clock
        figure and travel apart, in the checkpoint's timings.json (wallclock.py)."""
        return {"sums": dict(self.sums)}

    def load_state_dict(self, state: dict) -> None:
        self.sums = {k: int(state["sums"].get(k, 0)) for k in COUNTERS}
        self.sums.update({k: int(v) for k, v in state["sums"].items() if k not in COUNTERS})
        self.seconds = float(state.get("seconds", 0.0))  # older checkpoints kept them here


def rm_tokens(scorer, prompts: list[str], responses: list[str]) -> int:
    """Tokens a reward model reads for these texts (its own tokenizer, its truncation), or the
    whitespace word count when the scorer exposes no tokenizer."""
    tok = getattr(scorer, "tokenizer", None)
    limit = getattr(scorer, "max_length", None) or 10**9
    if tok is None:
        return sum(min(len(f"{p} {r}".split()), limit) for p, r in zip(prompts, responses))
    enc = tok([f"{p} {r}" for p, r in zip(prompts, responses)], add_special_tokens=True)
    return sum(min(len(ids), limit) for ids in enc["input_ids"])
