"""/metrics once it carries what the engines' spec logs hold: an engine's counters of its last rounds reach
the frontend with its next message (a heartbeat within a second), so a test waits for them, bounded, instead
of sleeping."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from openinfer.tools.spec_tally import SpecLogTally, read_spec_logs, tally_metrics


async def metrics_matching_logs(
    session: aiohttp.ClientSession, url: str, log_paths: list[Path], k: int, timeout: float = 30.0
) -> tuple[str, SpecLogTally]:
    """(/metrics' text, the spec logs) once every engine in the logs has its rounds in /metrics, bin by bin
    (K = ``k``); after ``timeout`` seconds without that, the last of each, for the caller's asserts to
    show what differs."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        async with session.get(f"{url}/metrics") as r:
            text = await r.text()
        logs = read_spec_logs(log_paths)
        metrics = tally_metrics(text)
        if (
            all(
                engine in metrics and metrics[engine].bins(k, k + 1) == tally.bins(k, k + 1)
                for engine, tally in logs.engines.items()
            )
            or asyncio.get_running_loop().time() > deadline
        ):
            return text, logs
        await asyncio.sleep(0.1)
