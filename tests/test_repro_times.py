"""make run's stage-time line (cli/repro_times.py), on real `dvc repro` output shapes."""

from __future__ import annotations

import io
import subprocess
import sys

from rlhf.cli.repro_times import StageClock, relay


class Ticks:
    """A clock that advances by the given steps, one per call."""

    def __init__(self, steps):
        self.t, self.steps = 0.0, iter(steps)

    def __call__(self):
        self.t += next(self.steps, 0.0)
        return self.t


def test_each_stage_gets_the_seconds_until_the_next_one_and_skips_are_named():
    chunks = [b"Stage 'world' didn't change, skipping\n",
              b"Running stage 'ingest':\n> rlhf ingest ...\n",
              b"ingest: 10/20\ringest: 20/20\nRunning st",  # a name cut between two reads
              b"age 'dedup':\n",
              b"Stage 'sft' is cached - skipping run, checking out outputs\n",
              b"Updating lock file 'dvc.lock'\n"]
    # clock calls: start, one per chunk, then the end (seconds() and line() each read it)
    clock = StageClock(Ticks([0, 1, 2, 30, 5, 1, 7, 0, 0]))
    out = io.BytesIO()
    relay(chunks, out, clock)
    assert out.getvalue() == b"".join(chunks)  # every byte passes through unchanged
    assert [n for n, _ in clock.seconds()] == ["ingest", "dedup"]
    line = clock.line()
    assert line.startswith("stage times: ingest 35 s, dedup 8 s; total 46 s")
    assert line.endswith("(unchanged, not rerun: world, sft)")


def test_the_filter_as_make_run_calls_it(tmp_path):
    text = "Running stage 'world':\nRunning stage 'ingest':\nStage 'dedup' didn't change, skipping\n"
    done = subprocess.run([sys.executable, "-m", "rlhf.cli.repro_times", str(tmp_path / "t.txt")],
                          input=text.encode(), capture_output=True, check=True)
    lines = done.stdout.decode().splitlines()
    assert lines[:3] == text.splitlines()
    assert lines[-1].startswith("stage times: world 0 s, ingest 0 s; total 0 s")
    assert lines[-1].endswith("(unchanged, not rerun: dedup)")
    assert (tmp_path / "t.txt").read_text() == lines[-1] + "\n"  # what make run repeats last
