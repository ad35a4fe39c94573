"""`make run`'s closing line: how long each stage of `dvc repro` took, read from its output.

`dvc repro` records no durations, so `make run` pipes its output through this filter, which
passes every byte on unchanged (progress lines included) and notes when each "Running stage"
line arrives; at the end it prints one line: each stage that ran with its seconds, then the
stages DVC skipped (unchanged, or restored from its cache). With a path argument the line is
also written there, for `make run` to repeat as its last line.

    dvc repro 2>&1 | python -m rlhf.cli.repro_times [.dvc/tmp/stage_times.txt]
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterable

RUNNING = re.compile(rb"Running stage '([^']+)'")
SKIPPED = re.compile(rb"Stage '([^']+)' (?:didn't change, skipping|is cached)")


class StageClock:
    """Feed it the output's chunks in order; `line()` is the summary."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.ran: list[tuple[str, float]] = []  # (stage, started at), in the order they ran
        self.skipped: list[str] = []
        self._tail = b""  # a stage name may be cut between two chunks

    def feed(self, chunk: bytes) -> None:
        text = self._tail + chunk
        now = self.clock()
        for m in RUNNING.finditer(text):
            self.ran.append((m.group(1).decode(), now))
        for m in SKIPPED.finditer(text):
            self.skipped.append(m.group(1).decode())
        # keep the unfinished last line for the next chunk, minus what was matched in it
        cut = max(text.rfind(b"\n"), text.rfind(b"\r"))
        rest = text[cut + 1:]
        self._tail = b"" if RUNNING.search(rest) or SKIPPED.search(rest) else rest[-200:]

    def seconds(self) -> list[tuple[str, float]]:
        end = self.clock()
        ends = [t for _, t in self.ran[1:]] + [end]
        return [(name, e - t) for (name, t), e in zip(self.ran, ends, strict=True)]

    def line(self) -> str:
        ran = self.seconds()
        total = self.clock() - self.started
        parts = [f"{name} {s:.0f} s" for name, s in ran] or ["no stage ran"]
        out = f"stage times: {', '.join(parts)}; total {total:.0f} s"
        if self.skipped:
            out += f" (unchanged, not rerun: {', '.join(self.skipped)})"
        return out


def relay(chunks: Iterable[bytes], out, clock: StageClock) -> None:
    for chunk in chunks:
        out.write(chunk)
        out.flush()
        clock.feed(chunk)


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    clock = StageClock()
    relay(iter(lambda: stdin.read1(4096), b""), stdout, clock)
    line = clock.line() + "\n"
    stdout.write(line.encode())
    stdout.flush()
    if len(sys.argv) > 1:
        from pathlib import Path

        path = Path(sys.argv[1])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line)


if __name__ == "__main__":
    main()
