"""The rank processes of tensor-parallel engines under test (``-tp N``): found in their engine's log, waited
for and killed by pid; and the greedy completions the tests compare across engines."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp

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


async def greedy_token_ids(
    url: str, prompts: list[list[int]], max_tokens: int, *, batched: bool = True
) -> list[list[int]]:
    """The greedy completion token ids of ``prompts`` (model "tiny", ``ignore_eos``): sent at once, so that
    the engine batches them, or with ``batched`` False one at a time (each round's batch then the same on
    every engine)."""
    body = {"model": "tiny", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    body |= {"return_token_ids": True}

    async def one(session: aiohttp.ClientSession, prompt: list[int]) -> list[int]:
        async with session.post(f"{url}/v1/completions", json={**body, "prompt": prompt}) as r:
            assert r.status == 200, await r.text()
            tokens: list[int] = (await r.json())["choices"][0]["token_ids"]
            return tokens

    async with aiohttp.ClientSession() as session:
        if batched:
            return list(await asyncio.gather(*(one(session, p) for p in prompts)))
        return [await one(session, p) for p in prompts]
