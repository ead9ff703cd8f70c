"""Overload: far more concurrent requests than the bounds allow get 503 + Retry-After at once, the admitted
ones complete, and the frontend's memory stays bounded round after round."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from tests.e2e.processes import Cluster

PER_ENGINE, TOTAL = 6, 10


@pytest.fixture(scope="module")
def bounded_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A frontend with small bounds and two slowed --fake-model engines (20 tokens take about a second)."""
    c = Cluster(tmp_path_factory.mktemp("overload"))
    try:
        c.start_frontend("--max-queued-per-engine", str(PER_ENGINE), "--max-queued-total", str(TOTAL))
        for index in (0, 1):
            c.start_fake_engine(index, "--step-sleep", "0.05")
        c.wait_healthy(engines=2)
        yield c
    finally:
        c.stop()


async def burst(url: str, n: int) -> list[tuple[int, str, str | None]]:
    """``n`` concurrent streaming requests: (status, the text or error, Retry-After) of each."""
    body = {"model": "fake", "prompt": "Hello", "max_tokens": 20, "ignore_eos": True, "stream": True}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def one() -> tuple[int, str, str | None]:
            async with session.post(f"{url}/v1/completions", json=body) as r:
                return r.status, await r.text(), r.headers.get("Retry-After")

        return await asyncio.gather(*(one() for _ in range(n)))


async def test_requests_past_the_bounds_get_503(bounded_cluster: Cluster) -> None:
    """200 at once: the admitted ones (at most the total bound at a time) stream to the end; every other
    gets 503 with Retry-After and an OpenAI error body instead of waiting in a queue."""
    results = await burst(bounded_cluster.url, 200)
    admitted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 503]
    assert len(admitted) + len(refused) == 200
    assert TOTAL <= len(admitted) < 100
    assert all("data: [DONE]" in text and '"finish_reason":"length"' in text for _, text, _ in admitted)
    assert all(retry_after == "1" and '"code":"overloaded"' in text for _, text, retry_after in refused)


async def test_memory_stays_bounded_under_repeated_overload(bounded_cluster: Cluster) -> None:
    """Rounds of 300 concurrent requests: the frontend's RSS after the last round is within a few MB of
    its RSS after the first (nothing piles up per refused or finished request)."""
    await burst(bounded_cluster.url, 300)
    first = bounded_cluster.rss_bytes("frontend")
    for _ in range(3):
        results = await burst(bounded_cluster.url, 300)
        assert sum(status == 503 for status, _, _ in results) > 200
    growth = bounded_cluster.rss_bytes("frontend") - first
    assert growth < 16 * 2**20, f"the frontend grew by {growth / 2**20:.1f} MiB"
