"""Checks the fault tests share: a frontend's /admin/engines, the spec logs split by what it counted, bounded
waits, and how requests ended while processes were killed."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

from openinfer.tools.delivered import Delivered
from openinfer.tools.spec_tally import SpecLogTally, read_spec_logs
from tests.e2e.load import Load
from tests.e2e.processes import ADMIN_HEADERS, Cluster


def admin_body(c: Cluster) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(
        urllib.request.Request(f"{c.url}/admin/engines", headers=ADMIN_HEADERS), timeout=2
    ) as r:
        return json.load(r)  # type: ignore[no-any-return]


def admin_engines(c: Cluster) -> dict[int, dict]:  # type: ignore[type-arg]
    return {e["index"]: e for e in admin_body(c)["engines"]}


def counted_logs(c: Cluster) -> SpecLogTally:
    """The engines' spec logs, split by the seqs the frontend says it counted of each incarnation."""
    delivered = Delivered.from_json(admin_body(c))
    logs = read_spec_logs(sorted(c.log_dir.glob("spec*.jsonl")), delivered=delivered)
    assert not logs.malformed, logs.malformed[:3]
    print("unsent tail drafts:", {i: t.num_drafts for i, t in logs.unsent.items()})
    print("earlier drafts:", {i: t.num_drafts for i, t in logs.earlier.items()})
    return logs


async def wait_for(condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except OSError:
            pass  # the frontend is not up yet
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s")
        await asyncio.sleep(0.1)


def engines_idle(c: Cluster, count: int) -> bool:
    """``count`` engines up whose latest snapshots at the frontend run and queue nothing: they draft no more."""
    engines = admin_engines(c).values()
    return len(engines) == count and all(
        engine["up"] and engine["load"]["num_running_reqs"] == engine["load"]["num_waiting_reqs"] == 0
        for engine in engines
    )


def assert_requests_ended(load: Load, frontend_down: list[tuple[float, float]]) -> None:
    """Nothing hung; errors say what happened; connection errors only while the frontend was down."""
    assert load.outcomes and not load.of_kind("timeout"), load.of_kind("timeout")[:3]
    assert len(load.of_kind("ok")) > 0.5 * len(load.outcomes)
    for outcome in load.of_kind("engine_error"):
        assert "engine" in outcome.message, outcome
    for outcome in load.of_kind("http"):
        assert outcome.status == 503 and outcome.message, outcome
    for outcome in load.of_kind("connection"):
        assert any(start - 0.5 <= outcome.ended <= end + 1.0 for start, end in frontend_down), outcome
