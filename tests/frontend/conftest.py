"""Fixtures: a frontend served in-process on 127.0.0.1, engine peers connected to it, and the fuzz tests'
frontend on a loop of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from openinfer.engine_core.launch.local_cluster import free_port_pair
from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.metrics.spec_decode.per_request import PerRequestSpecMetrics
from openinfer.frontend.metrics.state_dir import StateDir
from openinfer.frontend.openai.api_server import build_app
from openinfer.frontend.openai.cors import CorsPolicy
from openinfer.frontend.openai.http_runner import serve
from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from tests.e2e.processes import Cluster
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import (
    FakeEngine,
    FakeFrontendFactory,
    Frontend,
    FrontendFactory,
    PeerFactory,
    PortHold,
)
from tests.frontend.fuzz_harness import Harness, running_harness
from tests.frontend.waits import wait_until


@pytest.fixture
async def start_frontend() -> AsyncIterator[FrontendFactory]:
    """Start frontends on free ports (build_app's options as keywords); all stop at teardown."""
    started: list[Frontend] = []

    async def start(
        api_key: str | None = None,
        engine_timeout: float = 5.0,
        per_request_spec_metrics: PerRequestSpecMetrics = PerRequestSpecMetrics.SUMMARY,
        drafter_timeout: float = 120.0,
        state_dir: StateDir | None = None,
        engine_address: str | None = None,
        chat_parsers: ChatParsers | None = None,
        admin_api_key: str | None = None,
        cors: CorsPolicy | None = None,
        loopback_host: str | None = None,
        grammar_check_timeout: float = 5.0,
        chat_template_timeout: float = 5.0,
        keep_alive_s: float = 5.0,
        body_timeout: float = 60.0,
        **client_options: Any,
    ) -> Frontend:
        """``client_options``: EngineClient's keywords (max_queued_per_engine, curve_keys, ...)."""
        metrics = FrontendMetrics(state_dir)
        engine_address = engine_address or f"tcp://127.0.0.1:{free_port_pair()}"
        client = EngineClient(engine_address, metrics, engine_timeout=engine_timeout, **client_options)
        await client.start()
        app = build_app(
            client,
            metrics,
            api_key,
            per_request_spec_metrics,
            drafter_timeout,
            chat_parsers,
            admin_api_key=admin_api_key,
            cors=cors,
            loopback_host=loopback_host,
            grammar_check_timeout=grammar_check_timeout,
            body_timeout=body_timeout,
            chat_template_timeout=chat_template_timeout,
        )
        runner = await serve(app, "127.0.0.1", 0, keep_alive_s)
        host, port = runner.addresses[0][:2]
        frontend = Frontend(f"http://{host}:{port}", engine_address, client, metrics, runner)
        started.append(frontend)
        return frontend

    yield start
    for frontend in started:
        await frontend.stop()


@pytest.fixture
async def start_peer() -> AsyncIterator[PeerFactory]:
    """Start engine peers (``wait=False`` to skip waiting until the frontend sees them up and heard a
    message after their hello, as a real engine's first heartbeat)."""
    peers: list[EnginePeer] = []

    async def start(frontend: Frontend, config: PeerConfig | None = None, wait: bool = True) -> EnginePeer:
        peer = EnginePeer(frontend.engine_address, config)
        await peer.start()
        peers.append(peer)
        if wait:
            index, incarnation = peer.config.engine_index, peer.incarnation

            def heard() -> bool:
                record = frontend.client.registry.current(index, incarnation)
                return record is not None and record.up and record.heard_after_hello

            await wait_until(heard)
        return peer

    yield start
    for peer in peers:
        await peer.stop()


@pytest.fixture
async def frontend(start_frontend: FrontendFactory) -> Frontend:
    return await start_frontend()


@pytest.fixture
async def peer(frontend: Frontend, start_peer: PeerFactory) -> EnginePeer:
    return await start_peer(frontend)


@pytest.fixture
def harness() -> Iterator[Harness]:
    """The fuzz tests' frontend and peer, on an event loop hypothesis drives example by example."""
    with running_harness() as h:
        yield h


@pytest.fixture(scope="session")
def fake_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeEngine]:
    """One real ``--fake-model`` engine process for the session (served as "fake": the built-in 512-token
    vocabulary, 2048 positions, greedy output a 32-token cycle), stopped by pid at the end. It connects to
    its cluster's engine address, which each test's in-process frontend binds in turn
    (:func:`start_fake_frontend`): a frontend that binds it gets the engine's hello within a second."""
    cluster = Cluster(tmp_path_factory.mktemp("fake_engine"))
    ports = PortHold(cluster.engine_port)
    try:
        cluster.start_fake_engine(0)
        yield FakeEngine(cluster, ports)
    finally:
        cluster.stop()
        ports.release()


@pytest.fixture
async def start_fake_frontend(
    start_frontend: FrontendFactory, fake_engine: FakeEngine
) -> AsyncIterator[FakeFrontendFactory]:
    """Start an in-process frontend (build_app's options as keywords) on the session's fake engine and wait
    until that engine is up on it; at teardown it stops and the engine's ports are held again."""
    started: list[Frontend] = []

    async def start(**options: Any) -> Frontend:
        fake_engine.ports.release()
        frontend = await start_frontend(engine_address=fake_engine.address, **options)
        started.append(frontend)
        fake_engine.cluster.check_alive()
        await wait_until(lambda: frontend.client.num_engines_up == 1, timeout=60)  # the first: its start-up
        return frontend

    yield start
    for frontend in started:
        await frontend.stop()
    if started:
        fake_engine.ports.hold()


@pytest.fixture
async def fake_frontend(start_fake_frontend: FakeFrontendFactory) -> Frontend:
    """A frontend whose one engine is the session's real ``--fake-model`` engine process."""
    return await start_fake_frontend()
