"""A frontend in an event loop of its own, so that hypothesis can drive it from a plain test: the harness the
fuzz tests share (the ``harness`` fixture in conftest.py), and their hypothesis settings."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from hypothesis import HealthCheck, settings
from prometheus_client.parser import text_string_to_metric_families

from openinfer.engine_core.launch.local_cluster import free_port_pair
from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.openai.api_server import build_app
from openinfer.frontend.openai.cors import CorsPolicy
from openinfer.frontend.openai.http_runner import serve
from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.waits import wait_until

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@dataclass
class Harness:
    """A frontend with one peer (index 0, drafter commands refused) on an event loop run per example."""

    loop: asyncio.AbstractEventLoop
    client: EngineClient
    metrics: FrontendMetrics
    peer: EnginePeer
    url: str
    engine_address: str
    runner: Any
    session: aiohttp.ClientSession

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def counters(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every counter and histogram sample now, by (name, labels)."""
        text = self.metrics.render().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            if family.type in ("counter", "histogram")
            for s in family.samples
        }

    def completes(self) -> None:
        """A normal completion still works."""

        async def post() -> None:
            body = {"model": "tiny", "prompt": [50, 60, 70], "max_tokens": 3}
            async with self.session.post(f"{self.url}/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()

        self.run(post())


FUZZ_ADMIN_KEY = "fuzz-admin"


@contextmanager
def running_harness() -> Iterator[Harness]:
    """A :class:`Harness` on a new event loop of its own; everything it started stops on exit."""
    loop = asyncio.new_event_loop()

    async def start() -> Harness:
        metrics = FrontendMetrics()
        address = f"tcp://127.0.0.1:{free_port_pair()}"
        client = EngineClient(address, metrics)
        await client.start()
        parsers = ChatParsers("qwen3", "hermes", enable_auto_tool_choice=True)  # the output parsers run too
        # The admin routes are on (they need a key): the HTTP fuzz sends it unless it fuzzes that header.
        # CORS and the Host rule of a loopback server are on too: the HTTP fuzz sends Origin and Host headers.
        app = build_app(
            client,
            metrics,
            chat_parsers=parsers,
            admin_api_key=FUZZ_ADMIN_KEY,
            cors=CorsPolicy(("http://app.example",), allow_credentials=True),
            loopback_host="127.0.0.1",
        )
        runner = await serve(app, "127.0.0.1", 0)
        host, port = runner.addresses[0][:2]
        peer = EnginePeer(address, PeerConfig(refuse_drafter="refused by the fuzz peer"))
        await peer.start()
        await wait_until(lambda: client.num_engines_up == 1)
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        return Harness(loop, client, metrics, peer, f"http://{host}:{port}", address, runner, session)

    h = loop.run_until_complete(start())
    try:
        yield h
    finally:

        async def stop() -> None:
            await h.session.close()
            await h.peer.stop()
            await h.runner.cleanup()
            await h.client.close()

        loop.run_until_complete(stop())
        loop.close()
