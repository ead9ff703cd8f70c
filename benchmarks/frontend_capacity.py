"""The frontend's own capacity: streamed tokens per second it relays, on one core, from --fake-model engines.

Starts a frontend pinned to one core and ``--engines`` fake engines (no model: each step costs microseconds)
pinned with the load generator to the other cores, then runs streaming completions at each concurrency
level for ``--duration`` seconds. Reports output tokens/s and SSE events/s received by the clients, and the
frontend's CPU use over the run (100 % means the frontend's core was the limit):

    python -m openinfer.benchmarks.frontend_capacity --concurrency 16 64 256 [--spec-tokens 4]

With ``--api-servers 1 2 4`` each level runs over that many frontends sharing the HTTP port, as
``openinfer-serve --api-server-count N`` runs them (pinned to ``--frontend-cpu``'s cores; their CPU is
summed):

    python -m openinfer.benchmarks.frontend_capacity --api-servers 1 2 4 --concurrency 64 --frontend-cpu 0,1

With ``--spec-tokens K`` the engines run n-gram speculation on prompts from the fake model's cycle, so each
engine output carries up to K+1 tokens: the same per-event frontend work relays more tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import aiohttp

from openinfer.benchmarks.cluster_flags import LOAD_ENGINE, QUIET
from openinfer.engine_core.launch.local_cluster import LocalCluster

CYCLE_PROMPT = list(range(3, 35))  # the fake model's cycle: n-gram lookup hits


async def run_level(url: str, concurrency: int, duration: float, max_tokens: int) -> tuple[int, int, int]:
    """(output tokens, SSE events with text, requests) completed within ``duration`` seconds."""
    body = {
        "model": "fake",
        "prompt": CYCLE_PROMPT,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    totals = [0, 0, 0]
    deadline = time.monotonic() + duration

    async def client(session: aiohttp.ClientSession) -> None:
        # As little client work per event as possible (the clients share cores with the engines): count
        # event starts in raw chunks, parse only the usage chunk at the end.
        while time.monotonic() < deadline:
            events, tail = 0, b""
            async with session.post(f"{url}/v1/completions", json=body) as r:
                async for chunk in r.content.iter_any():
                    events += chunk.count(b"data: {")
                    tail = (tail + chunk)[-4096:]
            if time.monotonic() < deadline:  # count only requests that ended inside the window
                usage = tail[tail.rindex(b"data: {") + 6 :].split(b"\n", 1)[0]
                totals[0] += json.loads(usage)["usage"]["completion_tokens"]
                totals[1] += events - 1  # the usage chunk carries no text
                totals[2] += 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return totals[0], totals[1], totals[2]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per level")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--spec-tokens", type=int, help="n-gram speculation with this K on the engines")
    parser.add_argument("--api-servers", type=int, nargs="+", default=[1], help="frontends sharing the port")
    parser.add_argument("--frontend-cpu", default="0", help="core(s) for the frontend(s)")
    parser.add_argument("--other-cpus", help="cores for engines and clients (default: the other cores)")
    args = parser.parse_args()
    frontend_cpus = set(args.frontend_cpu.split(","))
    rest = [str(c) for c in sorted(os.sched_getaffinity(0)) if str(c) not in frontend_cpus]
    others = args.other_cpus or ",".join(rest) or args.frontend_cpu
    os.sched_setaffinity(0, {int(c) for c in others.split(",")})  # the clients run beside the engines
    speculation = f"ngram K={args.spec_tokens}" if args.spec_tokens else "none"
    print(f"{args.engines} fake engines, speculation: {speculation}, {args.max_tokens} tokens per request")
    print(
        "| api servers | concurrency | output tok/s | SSE events/s | frontends' CPU | frontend µs/event "
        "| others' CPU |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|")
    for count in args.api_servers:
        cluster = start(args, count, others)
        try:
            for concurrency in args.concurrency:
                print(measure(cluster, count, concurrency, args.duration, args.max_tokens))
        finally:
            cluster.stop()


def start(args: argparse.Namespace, api_servers: int, others: str) -> LocalCluster:
    """``api_servers`` frontends on one port (one plain frontend for 1) and the fake engines, warmed up."""
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="openinfer-capacity-")), api_servers)
    spec = ["--spec-method", "ngram", "--num-spec-tokens", str(args.spec_tokens)] if args.spec_tokens else []
    bounds = [*QUIET, "--max-queued-per-engine", "4096", "--max-queued-total", "8192"]
    try:
        if api_servers == 1:
            cluster.start_frontend(*bounds, cpus=args.frontend_cpu)
        else:
            cluster.start_api_servers(*bounds, cpus=args.frontend_cpu)
        for index in range(args.engines):
            cluster.start_fake_engine(index, *LOAD_ENGINE, *spec, cpus=others)
        cluster.wait_healthy(60.0, engines=args.engines)
        asyncio.run(run_level(cluster.url, 4 * api_servers, 2.0, 32))  # warm-up
    except BaseException:
        cluster.stop()
        raise
    return cluster


def measure(
    cluster: LocalCluster, api_servers: int, concurrency: int, duration: float, max_tokens: int
) -> str:
    """One level as a table row, with every process's CPU share over it (100 % = one core)."""
    names = list(cluster.processes)
    before = {name: cluster.cpu_seconds(name) for name in names}
    mine, started = time.process_time(), time.monotonic()
    tokens, events, _ = asyncio.run(run_level(cluster.url, concurrency, duration, max_tokens))
    elapsed = time.monotonic() - started
    cpu = {name: (cluster.cpu_seconds(name) - before[name]) / elapsed for name in names}
    cpu["clients"] = (time.process_time() - mine) / elapsed
    frontends = sum(share for name, share in cpu.items() if name.startswith("frontend"))
    per_event = 1e6 * frontends * elapsed / max(events, 1)
    others = ", ".join(
        f"{name} {100 * share:.0f} %" for name, share in cpu.items() if not name.startswith("frontend")
    )
    return (
        f"| {api_servers} | {concurrency} | {tokens / duration:,.0f} | {events / duration:,.0f} "
        f"| {100 * frontends:.0f} % | {per_event:.1f} | {others} |"
    )


if __name__ == "__main__":
    main()
