"""openinfer.benchmarks.frontend_capacity run briefly over one frontend and over two api servers sharing the
HTTP port (the socket serve hands them): a row per level, streamed events relayed at each."""

from __future__ import annotations

import subprocess
import sys


def test_a_short_run_over_one_and_two_api_servers_prints_its_rows() -> None:
    """Two levels (1 and 2 api servers, 4 streams, 1 s each): each row names its level and counts events."""
    argv = ["--api-servers", "1", "2", "--concurrency", "4", "--duration", "1", "--max-tokens", "16",
            "--frontend-cpu", "0,1", "--other-cpus", "0,1"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "openinfer.benchmarks.frontend_capacity", *argv],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [
        line.split("|")[1:-1]
        for line in run.stdout.splitlines()
        if line.startswith("| ") and "api" not in line
    ]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("1", "4"), ("2", "4")], run.stdout
    assert all(int(r[3].replace(",", "")) > 0 for r in rows), run.stdout  # SSE events/s relayed
