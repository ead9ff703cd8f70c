"""Frontend restart time under load: from kill -9 of the frontend under ``openinfer-serve`` to the new one
answering ``/health``, every engine back in it, and the first request it serves.

Starts ``openinfer-serve`` (the built-in model on the CPU with two engines unless told otherwise: arguments
this script does not know go to serve) with ``--state-dir`` and ``--spec-log-dir`` in the log folder, and
``--clients`` streaming clients that never stop. Per trial it SIGKILLs the frontend and times, from the kill:
the new frontend answering ``/health`` at all, ``/health`` saying every engine is up (they kept running and
reconnect to it), and a completion sent from then on finishing. Every restart waits the same
``--engine-restart-backoff`` (the backoff's cap is set to it, so later trials do not wait longer). At the end
the clients stop and ``openinfer-verify-log`` compares ``/metrics`` with the engines' spec logs.

    python -m openinfer.benchmarks.frontend_restart --trials 3
    python -m openinfer.benchmarks.frontend_restart --trials 3 --fake-model --spec-method ngram --step-sleep 0.02
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from openinfer.benchmarks.restart_load import restart_args, serving
from openinfer.engine_core.launch.local_cluster import (
    LocalCluster,
    answers_health,
    serve_children,
    wait_healthy,
)

Trial = tuple[float, float, float]  # seconds from the kill: answering /health, every engine up, first served


async def client(session: aiohttp.ClientSession, url: str, model: str, stop: asyncio.Event) -> int:
    """Streaming completions one after another until ``stop``; the number that did not finish (each followed
    by a pause of 0.1 s: no frontend, or no engine in it yet)."""
    body = {"model": model, "prompt": "ROMEO:", "max_tokens": 32, "ignore_eos": True, "stream": True}
    failed = 0
    while not stop.is_set():
        try:
            async with session.post(f"{url}/v1/completions", json=body) as r:
                done = [line async for line in r.content if line.startswith(b"data: [DONE]")]
        except aiohttp.ClientError:
            done = []
        if not done:
            failed += 1
            await asyncio.sleep(0.1)
    return failed


async def served(session: aiohttp.ClientSession, url: str, model: str) -> bool:
    """One short completion finished."""
    body = {"model": model, "prompt": "ROMEO:", "max_tokens": 4}
    try:
        async with session.post(f"{url}/v1/completions", json=body) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def trial(cluster: LocalCluster, serve_pid: int, engines: int, model: str) -> Trial:
    old = serve_children(serve_pid)["frontend"]
    killed = time.monotonic()
    os.kill(old, signal.SIGKILL)
    while serve_children(serve_pid).get("frontend", old) == old:  # serve has not started the new one yet
        await asyncio.sleep(0.01)
    while not await asyncio.to_thread(answers_health, cluster.url):
        await asyncio.sleep(0.01)
    answering = time.monotonic() - killed
    await asyncio.to_thread(wait_healthy, cluster.url, cluster, engines, 300.0)
    up = time.monotonic() - killed
    async with aiohttp.ClientSession() as session:
        while not await served(session, cluster.url, model):
            await asyncio.sleep(0.01)
    return answering, up, time.monotonic() - killed


async def run(cluster: LocalCluster, serve_pid: int, args: argparse.Namespace) -> list[Trial]:
    stop, results = asyncio.Event(), []
    async with aiohttp.ClientSession() as session:
        clients = [
            asyncio.create_task(client(session, cluster.url, args.model_name, stop))
            for _ in range(args.clients)
        ]
        await asyncio.sleep(3)  # the load is on every engine
        for number in range(args.trials):
            results.append(await trial(cluster, serve_pid, args.engines, args.model_name))
            answering, up, first = results[-1]
            print(
                f"trial {number + 1}: answering /health {answering:.2f} s after kill -9, every engine up "
                f"{up:.2f} s, first request served {first:.2f} s"
            )
            await asyncio.sleep(2)
        stop.set()
        failed = sum(await asyncio.gather(*clients))
    print(f"{failed} streamed requests did not finish (held by a killed frontend, or sent while it was down)")
    return results


def wait_idle(url: str, timeout: float = 60.0) -> None:
    """Until /metrics shows no request running or waiting on any engine: the snapshots it holds were taken
    after every step, so they hold every draft the spec logs hold."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            families = text_string_to_metric_families(response.read().decode())
            busy = sum(
                sample.value
                for family in families
                for sample in family.samples
                if sample.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
            )
        if busy == 0:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{url}: requests still running after {timeout:g} s")


def main() -> None:
    args, serve_flags = restart_args(__doc__)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="openinfer-frontend-restart-"))
    serve_flags += ["--state-dir", str(log_dir / "state"), "--spec-log-dir", str(log_dir)]
    with serving(log_dir, serve_flags, args) as (cluster, serve_pid):
        results = asyncio.run(run(cluster, serve_pid, args))
        wait_idle(cluster.url)
        spec_logs = sorted(str(path) for path in log_dir.glob("spec-engine*.jsonl"))
        verify = [
            sys.executable,
            "-m",
            "openinfer.tools.verify_log",
            "--metrics-url",
            f"{cluster.url}/metrics",
        ]
        checked = subprocess.run([*verify, "--spec-log", *spec_logs], capture_output=True, text=True)
        print(checked.stdout.splitlines()[-1] if spec_logs else "no spec logs: no speculation to check")
    answering, up, first = zip(*results, strict=True)
    print(
        f"median over {len(results)} trials: answering /health {statistics.median(answering):.2f} s, every "
        f"engine up {statistics.median(up):.2f} s, first request served {statistics.median(first):.2f} s after "
        f"kill -9 (of which {args.engine_restart_backoff:g} s backoff)"
    )


if __name__ == "__main__":
    main()
