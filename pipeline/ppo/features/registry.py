"""The feature registry: every rollout-economy feature declares itself here, once.

A `Feature` declares its `ppo:` keys (`ConfigField`s: type, default, range, help; `PPOConfig`
gains them as fields, the params check and the config reference read them), names its
switch(es), whose defaults are their plain-PPO (off) values, and its cross-field `check`; it
names the inputs it reads (a declared artifact such as the pool's embeddings, resolved by a
`FeatureContext`, never by a new `trainer.run` argument), the tables it writes, the counters it
adds to `StepCost`, the features it must come after, and `build(cfg, ctx)`, which returns its
hooks (hooks.py protocols). A feature that acts inside the loop's math (the λ-ε table, adaptive
clip, the light critic) has no `build`: it is registered so that its switch is one of plain
PPO's and the benchmark knows its code.

Everything that used to be kept by hand derives from the registry: the hooks the trainer runs
(`build_hooks`), `PLAIN_PPO` (`plain_values`), the `rlhf ppo` options of feature inputs and
tables (cli/ppo.py), the trainer's table folders, and the benchmark's "which inputs does this
arm read" (`input_switches`); PPOConfig's fields, ranges and config reference derive from
the features' `ConfigField`s (config.py). Adding a feature is one module with one
`register(Feature(...))` call, its import in features/__init__.py and its keys in params.yaml
(+ its tests); trainer.py, config.py and ranges.py do not change.

    python -c "from rlhf.pipeline.ppo.features import FEATURES; print(list(FEATURES))"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf.pipeline.ppo.hooks import GenerationHook, PostScoringHook, PromptGate, ReplaySource, \
    RolloutHooks, StepObserver


def _option(name: str) -> str:
    """The `rlhf ppo` option of an input or table key."""
    return "--" + name.replace("_", "-")


def _module_path(fn: Callable | None) -> str | None:
    """The repository path of the module defining `fn` (`rlhf.pipeline.ppo.features.tiers` ->
    pipeline/ppo/features/tiers.py); None outside the rlhf namespace (a test's toy feature)."""
    module = getattr(fn, "__module__", None) or ""
    if not module.startswith("rlhf."):
        return None
    return module.removeprefix("rlhf.").replace(".", "/") + ".py"


@dataclass(frozen=True)
class Input:
    """An artifact features read: `rlhf ppo --<key> PATH` (or, `from_params`, a section of the
    params file), turned into the object features use by `load(ctx, path)`."""
    key: str
    help: str
    load: Callable[[FeatureContext, Path | None], Any]
    from_params: bool = False  # no path option: `load` reads ctx.params

    @property
    def option(self) -> str:
        return _option(self.key)


@dataclass(frozen=True)
class Table:
    """A store table a feature writes through the trainer's step writer (`rlhf ppo --<name>`)."""
    name: str
    help: str

    @property
    def option(self) -> str:
        return _option(self.name)


@dataclass(frozen=True)
class ConfigField:
    """A `ppo:` key a feature declares next to its code: PPOConfig gains it as a field (config.py),
    the params check reads its type and `range` (a pipeline/ranges.py `Range`, or a tuple of them
    for a table's columns; None: any finite number), the config reference its `help`. A switch's
    default is its plain-PPO (off) value."""
    name: str
    type: Any
    default: Any
    help: str = ""
    range: Any = None


@dataclass(frozen=True)
class Feature:
    name: str
    # its switches: their names (the off value is the field's default) or {name: off value}
    switches: Mapping[str, Any] | tuple[str, ...]
    help: str = ""
    build: Callable[[Any, FeatureContext], list] | None = None  # its hooks; None: in the loop
    inputs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # key -> switches ((): all)
    tables: tuple[Table, ...] = ()
    counters: tuple[str, ...] = ()  # the StepCost.count names it adds
    after: tuple[str, ...] = ()  # features whose hooks come first (and are in ctx.built)
    # the code an arm runs only with this feature on, as repository paths (the benchmark's
    # dependencies): its own module (the one defining `build`) is added here, the rest it names
    modules: tuple[str, ...] = ()
    fields: tuple[ConfigField, ...] = ()  # every `ppo:` key it owns, switches included
    # the ppo key its fields follow in PPOConfig's field order (the order of `asdict`, so of the
    # checkpoints' trainer_state.json, and of the config reference); None: after the others
    follows: str | None = None
    check: Callable[[Any], None] | None = None  # cross-field rules: raises ConfigError
    active: Callable[[Any], bool] | None = None  # on-rule, else "a switch is off its plain value"

    def __post_init__(self) -> None:
        if (own := _module_path(self.build)) is not None:
            object.__setattr__(self, "modules", tuple(dict.fromkeys((own, *self.modules))))
        if not isinstance(self.switches, Mapping):  # names: off values are the fields' defaults
            declared = {c.name: c.default for c in self.fields}
            object.__setattr__(self, "switches", {k: declared.get(k) for k in self.switches})

    def on(self, cfg) -> bool:
        if self.active is not None:
            return bool(self.active(cfg))
        return any(getattr(cfg, k) != v for k, v in self.switches.items())

    def owned(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.switches, *(c.name for c in self.fields)]))


FEATURES: dict[str, Feature] = {}
INPUTS: dict[str, Input] = {}


def register(feature: Feature) -> Feature:
    """Add `feature` (a name, switch or owned field already registered is an error)."""
    if feature.name in FEATURES:
        raise ValueError(f"a feature named {feature.name!r} is already registered")
    taken = {k: f.name for f in FEATURES.values() for k in f.owned()}
    clash = sorted(k for k in feature.owned() if k in taken)
    if clash:
        raise ValueError(f"feature {feature.name!r}: ppo key(s) {', '.join(clash)} already "
                         f"belong to {', '.join(sorted({taken[k] for k in clash}))}")
    declared = {c.name: c for c in feature.fields}
    bare = [k for k in feature.switches if k not in declared]
    if bare:
        raise ValueError(f"feature {feature.name!r}: switch(es) {', '.join(bare)} declare no "
                         f"ConfigField")
    moved = [k for k, v in feature.switches.items() if declared[k].default != v]
    if moved:
        raise ValueError(f"feature {feature.name!r}: switch(es) {', '.join(moved)} must default "
                         f"to their plain-PPO value")
    unknown = sorted(set(feature.inputs) - set(INPUTS))
    if unknown:
        raise ValueError(f"feature {feature.name!r} reads unregistered input(s) {unknown}")
    FEATURES[feature.name] = feature
    return feature


def unregister(name: str) -> None:
    """Remove a feature (tests that register a toy one clean up with it)."""
    FEATURES.pop(name, None)


def register_input(inp: Input) -> Input:
    INPUTS.setdefault(inp.key, inp)
    return INPUTS[inp.key]


def ordered(features: Mapping[str, Feature] | None = None) -> list[Feature]:
    """Features in build order: registration order, each after the features it names."""
    features = FEATURES if features is None else features
    out: list[Feature] = []
    done: set[str] = set()

    def visit(f: Feature, path: tuple[str, ...]) -> None:
        if f.name in done:
            return
        if f.name in path:
            raise ValueError(f"feature order has a cycle: {' -> '.join(path + (f.name,))}")
        for a in f.after:
            if a in features:
                visit(features[a], path + (f.name,))
        done.add(f.name)
        out.append(f)

    for f in features.values():
        visit(f, ())
    return out


# --------------------------------------------------------------------------- derived views
def plain_values() -> dict[str, Any]:
    """{switch: plain-PPO value} of every registered feature (config.PLAIN_PPO)."""
    return {k: v for f in ordered() for k, v in f.switches.items()}


def declared_fields() -> dict[str, ConfigField]:
    """Every `ppo:` key registered features declare (config.py: those registered before PPOConfig
    was built are its fields; a later one's keys live in `PPOConfig.extra`)."""
    return {c.name: c for f in FEATURES.values() for c in f.fields}


def input_switches() -> dict[str, tuple[str, ...]]:
    """{input key: the switches that read it} (bench/economy/arms.py's `reads`)."""
    out: dict[str, list[str]] = {}
    for f in ordered():
        for key, switches in f.inputs.items():
            out.setdefault(key, []).extend(switches or tuple(f.switches))
    return {k: tuple(v) for k, v in out.items()}


def tables() -> dict[str, Table]:
    return {t.name: t for f in ordered() for t in f.tables}


def feature_of_table(name: str) -> Feature:
    return next(f for f in FEATURES.values() if any(t.name == name for t in f.tables))


def on(cfg) -> list[Feature]:
    return [f for f in ordered() if f.on(cfg)]


# --------------------------------------------------------------------------- inputs, hooks
class FeatureContext:
    """Resolves the inputs features ask for: from loaded `objects` (tests, benchmarks), else by
    loading the file at `paths[key]` once. Also what every feature may use: the config, the
    tokenizer, the light scorer, the prompts, the params file, `compute` (the ppo stage's
    device and dtype, compute.Compute, in which an input that is a model loads; None: float32
    on the CPU) and `built` (the hooks of the features built before, by name)."""

    def __init__(self, cfg, paths: Mapping[str, Path | str | None] | None = None, *,
                 objects: Mapping[str, Any] | None = None, tokenizer=None, light_scorer=None,
                 prompts=None, prompts_path=None, params: Path | None = None, compute=None):
        self.cfg, self.tokenizer, self.light_scorer = cfg, tokenizer, light_scorer
        self.compute = compute
        self.prompts, self.prompts_path, self.params = prompts, prompts_path, params
        self.paths = {k: Path(v) for k, v in (paths or {}).items() if v is not None}
        self.objects = {k: v for k, v in (objects or {}).items() if v is not None}
        self.built: dict[str, list] = {}

    def has(self, key: str) -> bool:
        return key in self.objects or key in self.paths or (
            key in INPUTS and INPUTS[key].from_params and self.params is not None)

    def optional(self, key: str):
        """The input, or None when it was not given."""
        if key in self.objects:
            return self.objects[key]
        if not self.has(key):
            return None
        self.objects[key] = INPUTS[key].load(self, self.paths.get(key))
        return self.objects[key]

    def get(self, key: str, needed_by: str):
        """The input; a one-line error naming the option when it was not given."""
        value = self.optional(key)
        if value is None:
            inp = INPUTS[key]
            where = "the params file" if inp.from_params else f"rlhf ppo {inp.option}"
            raise ValueError(f"{needed_by} needs {inp.help} ({where})")
        return value


def build_hooks(cfg, ctx: FeatureContext, extra: list | None = None) -> RolloutHooks:
    """The hooks of every feature `cfg` turns on, in feature order, sorted into the four
    protocols (one object may implement several); `extra` hooks (a benchmark's probe) last."""
    gates, gen, post, observers, replay = [], [], [], [], []
    for f in on(cfg):
        if f.build is None:
            continue
        ctx.built[f.name] = hooks = list(f.build(cfg, ctx))
        for h in hooks:
            _sort(h, gates, gen, post, observers, replay)
    for h in extra or []:
        _sort(h, gates, gen, post, observers, replay)
    return RolloutHooks(gates=gates, generation=gen, post_scoring=post, observers=observers,
                        replay=replay)


def _sort(h, gates, gen, post, observers, replay) -> None:
    kinds = ((PromptGate, gates), (GenerationHook, gen), (PostScoringHook, post),
             (StepObserver, observers), (ReplaySource, replay))
    hit = False
    for proto, bucket in kinds:
        if isinstance(h, proto):
            bucket.append(h)
            hit = True
    if not hit:
        raise TypeError(f"{type(h).__name__} implements none of the rollout protocols "
                        f"(hooks.py: PromptGate, GenerationHook, PostScoringHook, StepObserver, "
                        f"ReplaySource)")
