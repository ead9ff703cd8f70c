"""How the e2e tests read a running frontend over HTTP (/metrics, /admin/engines, /health), blocking or from
asyncio, and bounded polls of a condition."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable

import aiohttp

from tests.e2e.load import Samples, counter_samples
from tests.e2e.processes import ADMIN_HEADERS, Cluster


def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 50 ms; fail saying ``what`` if it is not true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    """The body of a GET (raises HTTPError on a status >= 400)."""
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
        return bytes(r.read())


def scrape(c: Cluster) -> Samples:
    """The counters of the frontend's /metrics."""
    return counter_samples(get(f"{c.url}/metrics").decode())


def counter(c: Cluster, name: str, **labels: str) -> float:
    """One counter's value in /metrics, 0 while the series does not exist."""
    return float(scrape(c).get((name, tuple(sorted(labels.items()))), 0.0))


def engines(c: Cluster) -> dict[int, dict]:  # type: ignore[type-arg]
    """/admin/engines by engine index."""
    return {e["index"]: e for e in json.loads(get(f"{c.url}/admin/engines", ADMIN_HEADERS))["engines"]}


def answers(url: str) -> bool:
    """Whether HTTP answers at all (/health is 503 without engines)."""
    try:
        get(f"{url}/health")
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def errors_key(kind: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The sample key of ``openinfer:protocol_errors_total{kind}`` in a scrape."""
    return "openinfer:protocol_errors_total", (("kind", kind),)


async def until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 60.0) -> None:
    """Poll ``condition`` until it holds (bounded)."""
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.05)


async def admin_engines(session: aiohttp.ClientSession, url: str) -> dict[int, dict]:  # type: ignore[type-arg]
    """/admin/engines by engine index, read from asyncio."""
    async with session.get(f"{url}/admin/engines", headers=ADMIN_HEADERS) as r:
        return {e["index"]: e for e in (await r.json())["engines"]}


async def engine_counter(session: aiohttp.ClientSession, url: str, name: str, engine: str) -> float:
    """One engine's counter in /metrics (its series summed), read from asyncio."""
    async with session.get(f"{url}/metrics") as r:
        samples = counter_samples(await r.text())
    return sum(v for (n, labels), v in samples.items() if n == name and ("engine", engine) in labels)


async def engines_idle(session: aiohttp.ClientSession, url: str, count: int = 2) -> bool:
    """``count`` engines' latest snapshots at the frontend: nothing running or waiting, no KV block held."""
    loads = [e["load"] for e in (await admin_engines(session, url)).values()]
    return len(loads) == count and all(
        (load["num_running_reqs"], load["num_waiting_reqs"], load["kv_used_blocks"]) == (0, 0, 0)
        for load in loads
    )
