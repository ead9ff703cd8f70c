"""Several frontends over the same engines: a frontend that is not an engine's metrics frontend (its hello
says ``exports_metrics`` false) exports none of that engine's series, yet routes requests to it."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from openinfer.protocol import SpecDecodeCounters
from tests.frontend.engine_peer import PeerConfig
from tests.frontend.frontends import Frontend, PeerFactory
from tests.frontend.metrics.scrape import sample, scrape, sync
from tests.frontend.waits import wait_until


def engines_in(text: str) -> set[str]:
    """The engine label of every sample of an exposition, but the request metrics' (this frontend's own)."""
    own = ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success")
    return {
        s.labels["engine"]
        for family in text_string_to_metric_families(text)
        if family.name not in own
        for s in family.samples
        if "engine" in s.labels
    }


async def test_only_the_metrics_frontend_exports_an_engine(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """Engine 0 names another frontend its metrics frontend, engine 1 this one: only engine 1's counters,
    gauges, up and restart series are here, while requests still reach both engines."""
    slow = 0.3  # seconds per token: a request runs while the next is routed
    elsewhere = await start_peer(
        frontend,
        PeerConfig(
            engine_index=0, spec=SpecDecodeCounters.zero(2), exports_metrics=False, token_delay_s=slow
        ),
    )
    here = await start_peer(
        frontend, PeerConfig(engine_index=1, spec=SpecDecodeCounters.zero(2), token_delay_s=slow)
    )
    for peer in (elsewhere, here):
        assert peer.spec is not None
        peer.spec.observe_draft(2, 1)
        await sync(frontend, peer)
    text = await scrape(frontend)
    assert engines_in(text) == {"1"}
    assert sample(text, "vllm:spec_decode_num_drafts_total", model_name="tiny", engine="1") == 1
    assert sample(text, "openinfer:engine_up", engine="1") == 1

    async def complete(session: aiohttp.ClientSession) -> None:
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2}
        async with session.post(f"{frontend.url}/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()

    async with aiohttp.ClientSession() as session:  # the second goes to the engine the first left idle
        first = asyncio.create_task(complete(session))
        await wait_until(lambda: len(elsewhere.requests) + len(here.requests) == 1)
        await asyncio.gather(first, complete(session))
    assert len(elsewhere.requests) == len(here.requests) == 1
    text = await scrape(frontend)
    assert engines_in(text) == {"1"}
    served = [sample(text, "vllm:request_success_total", model_name="tiny", engine=e, finished_reason="length")
              for e in ("0", "1")]  # fmt: skip
    assert served == [1, 1]  # this frontend's requests, on each engine
