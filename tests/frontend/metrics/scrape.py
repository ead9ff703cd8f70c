"""Reading a frontend's /metrics in tests: a snapshot sent and taken, the exposition scraped, one sample."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.frontend.engine_peer import EnginePeer
from tests.frontend.frontends import Frontend
from tests.frontend.waits import wait_until


async def sync(frontend: Frontend, peer: EnginePeer) -> None:
    """Send a snapshot of the peer's counters now and wait until the frontend has taken it."""
    seq = await peer.send_snapshot()
    index, incarnation = peer.config.engine_index, peer.incarnation
    await wait_until(
        lambda: (r := frontend.client.registry.current(index, incarnation)) is not None and r.last_seq >= seq
    )


async def scrape(frontend: Frontend) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{frontend.url}/metrics") as response:
            assert response.status == 200
            return await response.text()


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None
