#!/usr/bin/env python3
"""Fail when dvc.lock does not describe the committed code and params.

    .ci/lock_fresh.py [dvc.yaml ...]     # default: dvc.yaml (what `make run` builds)

Parses `dvc status --json <target>`. On a clean clone the pipeline's outputs are absent, so an
output that is missing ("deleted", "not in cache") and a missing dependency that git does not
track (another stage's output, or ../shared/realdata on a clone without it beside) are allowed.
Anything else fails with one line per problem: a changed or new dependency (code, data), a
changed param, a changed command, a modified output (a committed metrics file that the lock's
hash does not match), a stage never locked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MISSING = {"deleted", "not in cache"}


def tracked(path: str) -> bool:
    """Whether git tracks `path` (a file, or any file under a folder). A path outside the
    repository (../shared/realdata, which DVC reports absolute) is never tracked."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if not Path(path).resolve().is_relative_to(Path(root).resolve()):
        return False
    out = subprocess.run(["git", "ls-files", "--", path], capture_output=True, text=True,
                         check=True).stdout
    return bool(out.strip())


def problems(status: dict) -> list[str]:
    out = []
    for stage, items in sorted(status.items()):
        for item in items:
            if not isinstance(item, dict):  # "changed checksum", "always changed", ...
                out.append(f"{stage}: {item}")
                continue
            for kind, changes in item.items():
                if kind not in ("changed deps", "changed outs"):
                    out.append(f"{stage}: {kind} {json.dumps(changes, sort_keys=True)}")
                    continue
                for path, what in sorted(changes.items()):
                    if isinstance(what, dict):  # a params file: {section.key: modified|new|...}
                        out.append(f"{stage}: params {path} {json.dumps(what, sort_keys=True)}")
                    elif what in MISSING and (kind == "changed outs" or not tracked(path)):
                        continue
                    else:
                        out.append(f"{stage}: {kind.split()[1][:-1]} {path} {what}")
    return out


def main(argv: list[str]) -> int:
    targets = argv or ["dvc.yaml"]
    dvc = Path(sys.executable).with_name("dvc")
    found = []
    for target in targets:
        run = subprocess.run([str(dvc) if dvc.exists() else "dvc", "status", "--json", target],
                             capture_output=True, text=True, check=False)
        if run.returncode:
            print(f"lock check: dvc status {target} failed: {run.stderr.strip()}", file=sys.stderr)
            return 2
        found += [f"{target}: {p}" for p in problems(json.loads(run.stdout or "{}"))]
    for line in found:
        print(f"stale lock: {line}", file=sys.stderr)
    if found:
        print(f"dvc.lock does not describe the committed code/params ({len(found)} change(s)): "
              "rerun the changed stages (dvc repro) and commit dvc.lock with them",
              file=sys.stderr)
        return 1
    print(f"lock check: {', '.join(targets)} fresh (missing outputs allowed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
