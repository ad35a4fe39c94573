"""The report's figures: held-out gold against generated tokens (one curve per arm, the seeds'
range shaded) and against each other cost axis. Written by report.write_report.

    .venv/bin/python -m bench.economy --report-only   # rewrites BENCHMARKS.md and its figures
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import stats as st

# the figure's x-axes besides generated tokens
AXES = (("gen_token_forwards", "policy token-forwards in generation"),
        ("update_token_forwards", "policy token-forwards in the update"),
        ("rm_tokens", "reward-model tokens (light + strong)"))

def axis_value(p: dict, axis: str):
    c = p.get("cost") or {}
    if axis == "rm_tokens":
        vals = [c.get("light_rm_tokens"), c.get("strong_rm_tokens")]
        return None if vals[0] is None else sum(v or 0 for v in vals)
    return c.get(axis)


def cost_figure(path: Path, runs: dict, sft_gold: float, baseline: str) -> list[str]:
    """Gold against each compute axis (AXES) whose counts every run of an arm recorded at its
    checkpoints; returns the axes drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = []
    data = {}
    for axis, label in AXES:
        per_arm = {}
        for a, rs in runs.items():
            pts = [[(0, sft_gold)] + [(axis_value(p, axis), p["gold_mean"]) for p in r["points"]]
                   for r in rs]
            if all(x is not None and x > 0 for run in pts for x, _ in run[1:]):
                per_arm[a] = pts
        if per_arm:
            data[axis] = (label, per_arm)
            drawn.append(label)
    if not data:
        return []
    fig, axs = plt.subplots(1, len(data), figsize=(5.2 * len(data), 4.2), dpi=100, squeeze=False)
    for ax, (axis, (label, per_arm)) in zip(axs[0], data.items()):
        top = max(x for pts in per_arm.values() for run in pts for x, _ in run)
        grid = np.linspace(0, top, 201)
        for a, pts in per_arm.items():
            m = st.mean_curve(np.array([st.curve(run, grid) for run in pts]))
            ok = np.isfinite(m)
            ax.plot(grid[ok], m[ok], label=a, lw=2.2 if a == baseline else 1.4)
        ax.axhline(sft_gold, color="grey", ls=":", lw=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axs[0][0].set_ylabel("held-out gold (mean over seeds)")
    axs[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return drawn


def gold_figure(path: Path, grid, curves: dict, sft_gold: float, target: float, t_eq: float,
            baseline: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    for a, c in curves.items():
        m = st.mean_curve(c)
        ok = np.isfinite(m)
        line, = ax.plot(grid[ok], m[ok], label=f"{a} ({len(c)} seeds)",
                        lw=2.2 if a == baseline else 1.6)
        ax.fill_between(grid[ok], np.min(c[:, ok], axis=0), np.max(c[:, ok], axis=0),
                        color=line.get_color(), alpha=0.15, lw=0)
    ax.axhline(sft_gold, color="grey", ls=":", lw=1, label="SFT")
    ax.axhline(target, color="black", ls="--", lw=0.8, label=f"target ({baseline} final)")
    ax.axvline(t_eq, color="black", ls="-", lw=0.5, alpha=0.5)
    ax.set_xlabel("cumulative generated tokens")
    ax.set_ylabel("held-out gold (mean; band: min-max over seeds)")
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
