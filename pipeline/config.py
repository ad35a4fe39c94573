"""Typed configs: each stage's dataclass mirrors one section of `params.yaml`.

`load_config(params_path, "world")` is what every stage command reads: the typed dataclass,
every key given by the file (a missing section or key is an error, never a dataclass default);
unknown keys and mistyped values fail with an error naming the key and the section, and a
number outside its declared range (pipeline/ranges.py) with `section.key = value: allowed ...`.
`load_section` builds the same dataclass with the defaults for absent keys (library use: tests,
benchmarks). Hyperparameters live only in `params.yaml`; each field is documented once, in its
stage's dataclass.

    rlhf params check            # validates every section of params.yaml
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from rlhf.pipeline import ranges

T = TypeVar("T")

# Section name -> "module:Class" of its typed config. Imported lazily so that `rlhf --help`
# and the pure-math modules stay fast to import.
SECTIONS: dict[str, str] = {
    "world": "rlhf.pipeline.world:WorldConfig",
    "ingest": "rlhf.pipeline.ingest:IngestConfig",
    "dedup": "rlhf.pipeline.dedup:DedupConfig",
    "ppo": "rlhf.pipeline.ppo.config:PPOConfig",
    "sft": "rlhf.pipeline.sft:SftConfig",
    "preferences": "rlhf.pipeline.preferences:PreferencesConfig",
    "reward": "rlhf.pipeline.reward.stage:RewardConfig",
    "difficulty": "rlhf.pipeline.difficulty:DifficultyConfig",
    "router": "rlhf.pipeline.route:RouterConfig",
    "eval": "rlhf.pipeline.eval:EvalConfig",
    "judge": "rlhf.pipeline.models.judges:JudgeConfig",
    "demos": "rlhf.pipeline.demos:DemosConfig",
    "tracking": "rlhf.pipeline.tracking:TrackingConfig",
    "text": "rlhf.pipeline.models.text:TextConfig",
    "compute": "rlhf.pipeline.models.compute:ComputeConfig",
}


class ConfigError(ValueError):
    """A params.yaml problem, with the section and key in the message."""


def read_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"params file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(data).__name__}")
    return data


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if origin in (list, tuple):
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_type_ok(v, a) for v, a in zip(value, args))
        return all(_type_ok(v, args[0]) for v in value) if args else True
    if origin is dict:
        kt, vt = typing.get_args(tp) or (Any, Any)
        return isinstance(value, dict) and all(
            _type_ok(k, kt) and _type_ok(v, vt) for k, v in value.items()
        )
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def build(cls: type[T], data: Any, where: str, complete: bool = False) -> T:
    """Build dataclass `cls` from a mapping, checking keys and types; `where` names the section.
    `complete`: every field must be given (nested sections too); else absent keys take the
    dataclass defaults (library use: tests, benchmarks)."""
    if not isinstance(data, dict):
        raise ConfigError(f"[{where}] must be a mapping, got {type(data).__name__}")
    if hasattr(cls, "split"):  # keys of a feature registered late (PPOConfig.split)
        data = cls.split(data)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"[{where}] unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(sorted(fields))}"
        )
    table = ranges.of(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build(tp, value, f"{where}.{name}", complete)
            continue
        if not _type_ok(value, tp):
            raise ConfigError(
                f"[{where}] key {name!r} must be {getattr(tp, '__name__', tp)}, "
                f"got {value!r} ({type(value).__name__})"
            )
        if (msg := ranges.check(where, name, value, table.get(name, ranges.FINITE))):
            raise ConfigError(msg)
        if tp is float and isinstance(value, int):
            value = float(value)
        if typing.get_origin(tp) is tuple and isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    missing = [
        n for n, f in fields.items()
        if n not in kwargs and n != "extra" and (complete or (f.default is dataclasses.MISSING
                                             and f.default_factory is dataclasses.MISSING))
    ]
    if missing:
        hint = " (a stage reads every key from the params file, never a built-in default: " \
               "copy them from the shipped params.yaml)" if complete else ""
        raise ConfigError(f"[{where}] missing required key(s): {', '.join(missing)}{hint}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:  # __post_init__ checks
        raise ConfigError(f"[{where}] {exc}") from None


def config_class(section: str) -> type:
    try:
        target = SECTIONS[section]
    except KeyError:
        raise ConfigError(
            f"unknown params section {section!r}; known sections: {', '.join(sorted(SECTIONS))}"
        ) from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def load_section(path: str | Path, section: str, cls: type[T] | None = None) -> T:
    """The typed config of one section of the params file (defaults when the section is absent)."""
    cls = cls or config_class(section)
    params = read_params(path)
    return build(cls, params.get(section, {}) or {}, section)


def load_all(path: str | Path = "params.yaml") -> dict[str, Any]:
    """Validate every section of the params file as the stages read it (`load_config`): unknown
    sections and keys are errors, and so are missing keys."""
    params = read_params(path)
    return {name: build(config_class(name), value or {}, name, complete=True)
            for name, value in params.items()}


def load_config(path: str | Path, section: str, fields: tuple[str, ...] | None = None) -> Any:
    """What a stage reads from the params file: the typed config of `section`, every key given
    (a missing section or key is an error, never a silent default that may differ from
    params.yaml). With `fields`, only those keys of the section are read and required, and the
    result holds only them (a stage that samples as PPO does reads ppo.temperature, not `ppo`);
    their types are checked against the section's dataclass."""
    cls = config_class(section)
    params = read_params(path)
    if section not in params:
        raise ConfigError(f"{path}: no {section!r} section (sections: "
                          f"{', '.join(params) or 'none'})")
    data = params[section] or {}
    if fields is None:
        return build(cls, data, section, complete=True)
    if not isinstance(data, dict):
        raise ConfigError(f"[{section}] must be a mapping, got {type(data).__name__}")
    missing = [f for f in fields if f not in data]
    if missing:
        raise ConfigError(f"{path}: [{section}] missing required key(s): {', '.join(missing)}")
    cfg = build(cls, {f: data[f] for f in fields}, section)  # types and __post_init__ checks
    return types.SimpleNamespace(**{f: getattr(cfg, f) for f in fields})


def complete_section(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """`values` over every key of `section` at its dataclass default (nested sections merged), as
    plain YAML-ready data: what a params file must hold for `load_config` (tests write it). The
    values are not checked here: a bad one is the reading command's error."""
    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    def merge(base: dict, over: dict) -> dict:
        return {**base, **{k: merge(base[k], v) if isinstance(base.get(k), dict)
                           and isinstance(v, dict) else v for k, v in over.items()}}

    return merge(plain(dataclasses.asdict(config_class(section)())), plain(values))


def effective(cfg: Any) -> dict[str, Any]:
    """The values a stage ran with, as plain YAML/JSON data (the report's `params`): every field
    of its config, nested sections as mappings, tuples as lists."""
    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    return plain(dataclasses.asdict(cfg))
