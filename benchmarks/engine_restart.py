"""Engine restart time under load: from kill -9 of an engine under ``openinfer-serve`` to the first request
its new incarnation serves.

Starts ``openinfer-serve`` (the built-in model on the CPU with two engines unless told otherwise: arguments
this script does not know go to serve) and ``--clients`` streaming clients that never stop. Per trial it
SIGKILLs engine 0 and times, from the kill: the moment the frontend lists engine 0 up with a new incarnation
(``/admin/engines``), and the first request that incarnation finished (``vllm:request_success_total`` of
engine 0 moves). Every restart waits the same ``--engine-restart-backoff`` (the backoff's cap is set to it,
so later trials do not wait longer); the start of an engine (imports, weights, KV cache) is the rest.

    python -m openinfer.benchmarks.engine_restart --trials 3
    python -m openinfer.benchmarks.engine_restart --trials 3 --fake-model --step-sleep 0.02
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from openinfer.benchmarks.restart_load import restart_args, serving
from openinfer.engine_core.launch.local_cluster import LocalCluster, serve_children

# The admin routes are off without a key: serve gets this one in its environment, as a user would give it.
ADMIN_KEY = "engine-restart-benchmark"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


async def client(
    session: aiohttp.ClientSession, url: str, model: str, stop: asyncio.Event, errors: list[str]
) -> None:
    """Streaming completions one after another until ``stop``; the error messages seen are kept."""
    body = {"model": model, "prompt": "ROMEO:", "max_tokens": 32, "ignore_eos": True, "stream": True}
    while not stop.is_set():
        try:
            async with session.post(f"{url}/v1/completions", json=body) as r:
                async for line in r.content:
                    if line.startswith(b'data: {"error"'):
                        errors.append(line.decode())
        except aiohttp.ClientError as e:
            errors.append(str(e))
            await asyncio.sleep(0.1)


async def engine0(session: aiohttp.ClientSession, url: str) -> tuple[str, bool, float]:
    """Engine 0's (incarnation, up) at the frontend and the requests it finished (all incarnations)."""
    async with session.get(f"{url}/admin/engines", headers=ADMIN_HEADERS) as r:
        record = next(e for e in (await r.json())["engines"] if e["index"] == 0)
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    finished = sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "vllm:request_success_total" and s.labels.get("engine") == "0"
    )
    return record["incarnation"], record["up"], finished


async def trial(cluster: LocalCluster, serve_pid: int, session: aiohttp.ClientSession) -> tuple[float, float]:
    """(seconds to the new incarnation being up, seconds to its first finished request) after a kill -9."""
    incarnation, _, finished = await engine0(session, cluster.url)
    killed = time.monotonic()
    os.kill(serve_children(serve_pid)["engine0"], signal.SIGKILL)
    back = None
    while True:
        now_incarnation, up, now_finished = await engine0(session, cluster.url)
        if back is None and up and now_incarnation != incarnation:
            back = time.monotonic() - killed
        if back is not None and now_finished > finished:
            return back, time.monotonic() - killed
        if time.monotonic() - killed > 300:
            raise TimeoutError(f"engine 0 did not serve again within 300 s:\n{cluster.logs()}")
        await asyncio.sleep(0.05)


async def run(cluster: LocalCluster, serve_pid: int, args: argparse.Namespace) -> list[tuple[float, float]]:
    stop, errors = asyncio.Event(), list[str]()
    results = []
    async with aiohttp.ClientSession() as session:
        clients = [
            asyncio.create_task(client(session, cluster.url, args.model_name, stop, errors))
            for _ in range(args.clients)
        ]
        await asyncio.sleep(3)  # the load is on every engine
        for number in range(args.trials):
            back, served = await trial(cluster, serve_pid, session)
            results.append((back, served))
            print(
                f"trial {number + 1}: engine 0 up again {back:.2f} s after kill -9, first request served {served:.2f} s"
            )
            await asyncio.sleep(2)
        stop.set()
        await asyncio.gather(*clients)
    print(f"{len(errors)} requests ended with an error (those engine 0 held at each kill)")
    return results


def main() -> None:
    args, serve_flags = restart_args(__doc__)
    os.environ["OPENINFER_ADMIN_API_KEY"] = ADMIN_KEY
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="openinfer-restart-"))
    with serving(log_dir, serve_flags, args) as (cluster, serve_pid):
        results = asyncio.run(run(cluster, serve_pid, args))
    backs, served = zip(*results, strict=True)
    print(
        f"median over {len(results)} trials: up again {statistics.median(backs):.2f} s, first request served "
        f"{statistics.median(served):.2f} s after kill -9 (of which {args.engine_restart_backoff:g} s backoff)"
    )


if __name__ == "__main__":
    main()
