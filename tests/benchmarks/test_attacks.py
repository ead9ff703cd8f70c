"""openinfer.benchmarks.attacks run briefly against real openinfer-serve processes: its table, and nothing of
what it started left running."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from openinfer.benchmarks.attacks import HEADER


def test_one_short_attack_prints_its_rows_and_leaves_no_process() -> None:
    """A 1-second cross-origin run prints the header, a rule and one full row per window (baseline, the attack),
    and every process it started (each server's serve, frontend and engine, the observer) is gone after it."""
    run = subprocess.run(
        [sys.executable, "-m", "openinfer.benchmarks.attacks", "--attacks", "cross_origin", "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    header, rule, *rows = run.stdout.splitlines()
    assert header == HEADER
    columns = header.count(" | ") + 1  # 11
    assert rule == "|" + "---|" * columns
    assert [row.split(" | ")[0] for row in rows] == ["| baseline", "| cross_origin"]
    assert [row.count(" | ") + 1 for row in rows] == [columns, columns]
    assert "text/plain" in rows[1].split(" | ")[-1]  # the outcome names what was sent
    # "observer pid N", then per server "openinfer-serve pid N (engine0 N, frontend N) at URL"
    pids = [int(pid) for pid in re.findall(r"(?:pid|engine0|frontend) (\d+)", run.stderr)]
    assert len(pids) == 1 + 2 * 3, run.stderr
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
