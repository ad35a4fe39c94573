"""What every scale benchmark records beside its figures (bench/data/*.json): the command, the
commit, the machine, its cores and the load average when the run started. Seconds measured on a
shared machine are upper bounds; the load says how far to trust them.

    python -c "import sys; sys.path.insert(0, 'bench'); from run_meta import run_meta; print(run_meta())"
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+uncommitted changes" if dirty else "")


def run_meta() -> dict:
    script = Path(sys.argv[0]).resolve()
    rel = script.relative_to(REPO).as_posix() if script.is_relative_to(REPO) else script.name
    return {"command": " ".join(["python", rel, *map(shlex.quote, sys.argv[1:])]),
            "commit": _commit(), "machine": _cpu_name(), "cpus": os.cpu_count(),
            "load_1min_at_start": round(os.getloadavg()[0], 2)}


def write_json(path: Path, meta: dict, rows: list[dict], **extra) -> None:
    """meta + rows (+ extra keys) as JSON at `path`, written whole (temporary file, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({**meta, **extra, "rows": rows}, indent=1) + "\n")
    tmp.replace(path)
