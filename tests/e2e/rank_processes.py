"""The rank processes of tensor-parallel engines under test (``-tp N``): found in their engine's log, waited
for and killed by pid."""

from __future__ import annotations

import re
import time

from tests.e2e.processes import Cluster, kill_all
from tests.e2e.serve_under_test import gone

RANK_STARTED = re.compile(r"started rank (\d+) of (\d+) \(pid (\d+)\)")


def rank_pids(log: str) -> list[int]:
    """The rank processes an engine's log says it started, in order."""
    return [int(m.group(3)) for m in RANK_STARTED.finditer(log)]


def wait_gone(pids: list[int], timeout: float = 30.0) -> None:
    """Until every one of ``pids`` has exited (a bounded wait)."""
    deadline = time.monotonic() + timeout
    while not all(gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running after {timeout} s: {pids}"
        time.sleep(0.05)


def cluster_log(cluster: Cluster, name: str) -> str:
    """What the cluster's process ``name`` (``engine0``, ``serve``) has logged so far."""
    assert cluster.log_dir is not None
    return (cluster.log_dir / f"{name}.log").read_text(errors="replace")


def stop_with_ranks(cluster: Cluster, *engines: int) -> None:
    """Stop the cluster's processes, then kill by pid every rank its ``engines`` started (they die with their
    engine; this is the bound) and wait until they are gone."""
    cluster.stop()
    pids = [pid for index in engines for pid in rank_pids(cluster_log(cluster, f"engine{index}"))]
    kill_all(pids)
    wait_gone(pids)
