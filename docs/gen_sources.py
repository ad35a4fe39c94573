"""What docs/generate.py's pages quote, and how they stamp it: the metrics files as git holds
them (not as the last `make run` rewrote them), their flattened keys, a figure's printed form, and
the source lines (path, content hash, last commit) a generated section opens with.

    python docs/generate.py --check
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

COMMAND = "python docs/generate.py"
# the metrics folders the docs quote, and the prefix a quote names their stages with
METRICS_DIRS = (("artifacts/metrics", ""), ("profiles/realdata/artifacts/metrics", "realdata/"))


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def metrics_files(root: Path, under: str = "artifacts/metrics") -> list[tuple[Path, bytes]]:
    """Each metrics file git tracks under `under`, with its content as git's index holds it (every
    *.json there, as it stands, when not in a git tree). The docs quote what is committed, not
    what the last `make run` wrote: on a CPU model other than the lock's, `make run` rewrites
    these files (other float kernels, other figures), and the docs must stay true for the next
    clean clone; `git add` a metrics file to quote its new figures."""
    listed = _git(root, "ls-files", "-s", "--", f"{under}/*.json")
    if not listed:
        return [(p, p.read_bytes()) for p in sorted((root / under).glob("*.json"))]
    blobs = {}
    for line in listed.splitlines():
        meta, rel = line.split("\t", 1)
        _mode, sha, stage = meta.split()
        if stage == "0":  # a merge conflict's sides (stages 1-3) are no figures yet
            blobs[root / rel] = sha
    return [(p, subprocess.run(["git", "cat-file", "blob", sha], cwd=root, capture_output=True,
                               check=True).stdout) for p, sha in sorted(blobs.items())]


def drifted(root: Path) -> list[str]:
    """The metrics files whose working copy differs from git's: what the pages do not quote."""
    return [p.relative_to(root).as_posix() for under, _ in METRICS_DIRS
            for p, data in metrics_files(root, under) if not p.is_file() or p.read_bytes() != data]


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
    return json.dumps(v) if not isinstance(v, (int, str)) else str(v)


def stamp(root: Path, path: Path, data: bytes | None = None) -> list[str]:
    rel = path.relative_to(root).as_posix()
    digest = hashlib.sha256(path.read_bytes() if data is None else data).hexdigest()[:12]
    commit = _git(root, "log", "-1", "--format=%h %cs", "--", rel) or "not committed"
    return [f"- source: `{rel}` (sha256 `{digest}`)",
            f"- last commit that changed it: {commit}"]
