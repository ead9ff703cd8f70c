"""Issue 39's exactness attack: an operator cycling an engine's drafter under load behind several api servers,
then ``openinfer-verify-log --engines-url``'s comparison of /metrics with the spec logs."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from openinfer.benchmarks.attack_target import ADMIN_HEADERS, ADMIN_KEY, Target, get
from openinfer.tools.delivered import fetch_delivered
from openinfer.tools.spec_tally import read_spec_logs, tally_metrics
from openinfer.tools.verify_log import compare

# What the operator does to engine 0, in turn, three times: K=5, K=7, speculation off.
CHANGES: tuple[dict[str, object] | None, ...] = (
    {"method": "ngram", "num_spec_tokens": 5},
    {"method": "ngram", "num_spec_tokens": 7},
    None,
)
STREAMS = 6  # greedy streams running throughout, spread over the api servers by the shared port


async def _stream(target: Target, stop: asyncio.Event) -> None:
    body = target.body(prompt="ROMEO: ROMEO: ROMEO:", max_tokens=200, temperature=0.0, stream=True)
    while not stop.is_set():
        async with aiohttp.ClientSession() as session:  # a connection each: every api server gets some
            async with session.post(f"{target.url}/v1/completions", json=body) as r:
                await r.read()


async def _idle(target: Target) -> None:
    """Until every engine's latest snapshot runs and queues nothing (bounded: 60 s)."""
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as session:
        while time.monotonic() < deadline:
            async with session.get(f"{target.url}/admin/engines") as r:
                loads = [e["load"] for e in (await r.json())["engines"]]
            if all(load["num_running_reqs"] == load["num_waiting_reqs"] == 0 for load in loads):
                return
            await asyncio.sleep(0.2)


async def drafter_swaps(target: Target) -> str:
    """Engine 0's drafter cycled K=5 -> K=7 -> unloaded three times, ``target.seconds / 9`` apart, under six
    greedy streams; then, once idle, /metrics against the spec logs over the seqs the frontends counted."""
    stop = asyncio.Event()
    streams = [asyncio.create_task(_stream(target, stop)) for _ in range(STREAMS)]
    statuses: list[int] = []
    route = f"{target.url}/admin/engines/0/drafter"
    try:
        async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as admin:
            for change in CHANGES * 3:
                await asyncio.sleep(target.seconds / 9)
                request = admin.post(route, json=change) if change else admin.delete(route)
                async with request as r:
                    statuses.append(r.status)
    finally:
        stop.set()
        await asyncio.gather(*streams, return_exceptions=True)
    await _idle(target)
    await asyncio.sleep(1.5)  # every api server took its engines' idle snapshots (heartbeats: at most 1 s)
    delivered = await asyncio.to_thread(fetch_delivered, f"{target.url}/admin/engines", ADMIN_KEY)
    logs = read_spec_logs(sorted(target.spec_log_dir.glob("*.jsonl")), delivered=delivered)
    metrics = tally_metrics(await get(target, "/metrics"))
    differences = compare(metrics, logs.engines)
    drafts = (sum(t.num_drafts for t in metrics.values()), sum(t.num_drafts for t in logs.engines.values()))
    changes = f"{statuses.count(200)} of {len(statuses)} drafter changes answered 200"
    if differences:
        return f"{changes}; {len(differences)} differing bins (drafts {drafts[0]} on /metrics, {drafts[1]} logged)"
    return f"{changes}; /metrics equals the spec logs bin by bin ({drafts[0]} drafts)"
