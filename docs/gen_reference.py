"""docs/generate.py's reference pages, read from the code: config.md (every params.yaml key from
the typed configs: type, default, shipped value, range from pipeline/ranges.py's declaration,
meaning from the field's comment or a feature's declared help) and features.md (the PPO feature
registry's switches and whether params.yaml turns each on).

    python docs/generate.py
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any

from gen_sources import COMMAND


def _comments(src: str) -> dict[int, str]:
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def field_meanings(cls: type) -> dict[str, str]:
    """{field: its comment}: the comment on the field's line, else the comment lines just above.
    PPOConfig is built from its `core` class (the loop's keys, commented) and the features'
    declarations (`feature_fields`, each with its help)."""
    declared = {k: c.help for k, c in getattr(cls, "feature_fields", {}).items()}
    src = textwrap.dedent(inspect.getsource(getattr(cls, "core", cls)))
    comments = _comments(src)
    lines = src.splitlines()
    out = {}
    for node in ast.parse(src).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            n = node.lineno
            text = comments.get(n, "")
            if not text:
                above, i = [], n - 1
                while i >= 1 and lines[i - 1].strip().startswith("#"):
                    above.insert(0, comments.get(i, ""))
                    i -= 1
                text = " ".join(above)
            out[node.target.id] = text
    return {**out, **declared}


def _type_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    s = getattr(t, "__name__", None) if typing.get_origin(t) is None else None
    return s or str(t).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "(required)"


def short(v: Any, n: int = 60) -> str:
    if dataclasses.is_dataclass(v):
        v = dataclasses.asdict(v)
    s = v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)
    s = s.replace("|", "\\|")
    return s if len(s) <= n else s[: n - 1] + "…"


def range_text(spec: Any) -> str:
    """A declared range as the reference prints it: a `Range`, or a table's columns in order."""
    if spec is None:
        return ""
    if isinstance(spec, tuple):
        return "columns: " + ", ".join(str(r) for r in spec)
    return str(spec)


def config_page(root: Path) -> str:
    import yaml
    from rlhf.pipeline import ranges
    from rlhf.pipeline.config import SECTIONS, config_class

    params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) or {}
    head = "| key | type | default | params.yaml | range | meaning |"
    lines = ["# Configuration reference", "",
             f"<!-- written by `{COMMAND}` from the typed configs and params.yaml -->", "",
             ("Every key of params.yaml, section by section: the typed dataclass that checks it "
             "(`rlhf params check`), its type and built-in default, the value params.yaml ships, "
             "and its meaning (the field's comment in the code). The stages read every key from "
             "params.yaml; the built-in default is what a test or a library call gets."), ""]
    for section in SECTIONS:
        cls = config_class(section)
        shipped = params.get(section) or {}
        meanings = field_meanings(cls)
        declared = ranges.of(cls)  # the one declaration the params check reads
        hints = typing.get_type_hints(cls)
        lines += [f"## `{section}`", "", f"`{cls.__module__}.{cls.__qualname__}`", "", head,
                  "|" + "---|" * head.count(" | ") + "---|"]
        rows = [(f.name, _type_name(hints.get(f.name, f.type)), _default(f),
                 meanings.get(f.name, "")) for f in dataclasses.fields(cls)
                if not f.name.startswith("_") and f.name != "extra"]
        if section == "ppo":
            from rlhf.pipeline.ppo.features.registry import declared_fields
            rows += [(c.name, _type_name(c.type), c.default, c.help)
                     for c in declared_fields().values() if c.name not in hints]
        for name, tname, default, meaning in rows:
            value = short(shipped[name]) if name in shipped else "–"
            cells = [f"`{name}`", f"`{tname}`".replace("|", "\\|"), short(default), value,
                     range_text(declared.get(name)), meaning.replace("|", "\\|")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def features_page(root: Path) -> str:
    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.ppo.features.registry import ordered

    cfg = load_section(root / "params.yaml", "ppo")
    lines = ["# PPO features (the rollout-economy switches)", "",
             f"<!-- written by `{COMMAND}` from pipeline/ppo/features/ and params.yaml -->", "",
             ("Every registered feature: its switch(es), whether params.yaml's `ppo:` section "
             "(what `make run` trains with) turns it on, and what it does. Plain PPO is every "
             "switch at its off value. Measured verdicts: [BENCHMARKS.md](../../BENCHMARKS.md) "
             "and [../ppo.md](../ppo.md)."), "",
             "| feature | switches (off value) | on in params.yaml | what it does |",
             "|---|---|---|---|"]
    for f in ordered():
        sw = ", ".join(f"`{k}` ({short(v)})" for k, v in f.switches.items())
        lines.append(f"| `{f.name}` | {sw} | {'**on**' if f.on(cfg) else 'off'} | "
                     f"{f.help.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
