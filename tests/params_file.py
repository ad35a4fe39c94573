"""Params files for tests: the stages read every key of their sections (config.load_config), so a
test names only the keys it changes and the rest are the dataclass defaults, written out."""

from __future__ import annotations

from pathlib import Path


def write_params(path: Path, **sections: dict) -> Path:
    """Write `path` with each given section completed (`config.complete_section`); a file for a
    training stage (sft, reward, ppo) also gets the `tracking` section they read (defaults), a stage
    that renders prompts the `text` section (defaults), and one that runs a model the `compute`
    section (defaults: this machine's auto)."""
    import yaml
    from rlhf.pipeline.config import complete_section

    if {"sft", "reward", "ppo"} & set(sections):
        sections = {**sections, "tracking": sections.get("tracking", {})}
    if {"sft", "preferences", "reward", "difficulty", "ppo", "eval", "judge"} & set(sections):
        sections = {**sections, "text": sections.get("text", {})}  # how prompts render
    if {"sft", "preferences", "reward", "difficulty", "judge", "ppo", "eval"} & set(sections):
        sections = {**sections, "compute": sections.get("compute", {})}

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({name: complete_section(name, values or {})
                                    for name, values in sections.items()}, sort_keys=False))
    return path
