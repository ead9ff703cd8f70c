"""Time from an engine's death (SIGKILL) to the error reaching its streaming clients.

Starts a frontend (with a long ``--engine-timeout``, so only the closed connection can make it fast) and two
slowed --fake-model engines; per trial, opens ``--streams`` streaming requests, waits until all have tokens,
SIGKILLs engine 0, and times each of its clients from the kill to the error event; then restarts engine 0.

    python -m openinfer.benchmarks.engine_death --trials 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from openinfer.benchmarks.cluster_flags import LOAD_ENGINE, QUIET
from openinfer.engine_core.launch.local_cluster import LocalCluster


async def stream(session: aiohttp.ClientSession, url: str, started: asyncio.Event) -> tuple[float, str]:
    """(monotonic time the stream ended, its error message or "")."""
    body = {"model": "fake", "prompt": "Hello", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    error = ""
    async with session.post(f"{url}/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                started.set()
                event = json.loads(line[6:])
                if "error" in event:
                    error = event["error"]["message"]
    return time.monotonic(), error


async def trial(cluster: LocalCluster, streams: int) -> list[float]:
    """Seconds from SIGKILL to the error, for each client of the killed engine."""
    async with aiohttp.ClientSession() as session:
        flags = [asyncio.Event() for _ in range(streams)]
        tasks = [asyncio.create_task(stream(session, cluster.url, flag)) for flag in flags]
        await asyncio.gather(*(flag.wait() for flag in flags))
        await asyncio.sleep(0.5)
        killed = time.monotonic()
        cluster.kill("engine0")
        # The killed engine's clients end with an error (the 30 s timeout cannot be what ends them within
        # 5 s); the live engine's streams are cancelled then.
        done, pending = await asyncio.wait(tasks, timeout=5)
        failed = [task.result() for task in done if task.result()[1]]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return [ended - killed for ended, _ in failed]


async def run(cluster: LocalCluster, trials: int, streams: int) -> list[float]:
    delays: list[float] = []
    for number in range(trials):
        delays_now = await trial(cluster, streams)
        print(f"trial {number + 1}: {len(delays_now)} clients, " + ", ".join(f"{d:.3f}" for d in delays_now))
        delays += delays_now
        cluster.start_fake_engine(0, *LOAD_ENGINE, "--step-sleep", "0.02")
        await asyncio.to_thread(cluster.wait_healthy, 60.0, 2)
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--streams", type=int, default=8, help="streams per trial, over both engines")
    args = parser.parse_args()
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="openinfer-death-")))
    try:
        cluster.start_frontend(*QUIET, "--engine-timeout", "30")
        for index in (0, 1):
            cluster.start_fake_engine(index, *LOAD_ENGINE, "--step-sleep", "0.02")
        cluster.wait_healthy(60.0, engines=2)
        delays = asyncio.run(run(cluster, args.trials, args.streams))
    finally:
        cluster.stop()
    print(
        f"SIGKILL -> client error over {len(delays)} clients in {args.trials} trials: "
        f"median {statistics.median(delays):.3f} s, min {min(delays):.3f} s, max {max(delays):.3f} s"
    )


if __name__ == "__main__":
    main()
