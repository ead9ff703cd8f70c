"""Fuzzing (hypothesis, bounded): the wire decoders and the frontend's engine socket on arbitrary and mutated
frames, every HTTP route on arbitrary bodies and headers. Nothing crashes, no 5xx but 503, no counter moves
but the protocol-error one, and the server still serves afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from openinfer import protocol
from openinfer.frontend.addresses import engine_addresses
from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.openai.api_server import build_app, serve
from openinfer.frontend.openai.cors import CorsPolicy
from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from tests.frontend.conftest import free_port_pair, wait_until
from tests.frontend.engine_peer import EnginePeer, PeerConfig

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _spec() -> protocol.SpecDecodeCounters:
    c = protocol.SpecDecodeCounters.zero(3)
    c.observe_draft(3, 2)
    return c


_LOAD = protocol.LoadSnapshot(1, 64, 1, 0, _spec())
# Valid messages of both directions to mutate; none is for the live peer (index 0, random incarnation), and
# hellos carry no usable tokenizer, so even a mutation that still decodes cannot pose as a real engine.
_BASES = [
    protocol.EngineOutputCodec().encode(
        protocol.EngineHello(
            protocol.PROTOCOL_VERSION, 7, 12345, 0, "tiny", 64, 16, 64, 3, 300, [0], b"{}", b"{}", _LOAD
        )
    ),
    protocol.EngineOutputCodec().encode(
        protocol.EngineCoreOutputs(
            7, 12345, 1, 1.0, [protocol.EngineCoreOutput("x", [5], protocol.FinishReason("stop", 5))], _LOAD
        )
    ),
    protocol.EngineOutputCodec().encode(
        protocol.EngineCoreOutputs(0, 999, 4, 1.0, [protocol.EngineCoreOutput("y", [1, 2])], _LOAD)
    ),
    protocol.EngineOutputCodec().encode(protocol.DrafterReply(7, 12345, 2, "c", True, "ok", 3, _LOAD)),
    protocol.EngineInputCodec().encode(
        protocol.EngineCoreRequest("r", [1, 2, 3], protocol.SamplingParams(max_tokens=4))
    ),
    protocol.EngineInputCodec().encode(protocol.AbortRequests(["r"])),
]


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """Arbitrary bytes, or a valid frame with bytes overwritten, cut short or extended."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=300))
    frame = bytearray(draw(st.sampled_from(_BASES)))
    for position, byte in draw(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4)):
        frame[position % len(frame)] = byte
    cut = draw(st.none() | st.integers(0, len(frame)))
    if cut is not None:
        del frame[cut:]
    return bytes(frame) + draw(st.binary(max_size=8))


def _decodes(frame: bytes) -> object | None:
    try:
        return protocol.EngineOutputCodec().decode(frame)
    except protocol.ProtocolError:
        return None


@given(frame=frames())
@FUZZ
def test_decoders_raise_only_protocol_errors(frame: bytes) -> None:
    """Either direction's decoder returns a message or raises protocol.ProtocolError with a kind, nothing else."""
    for codec in (protocol.EngineOutputCodec(), protocol.EngineInputCodec()):
        try:
            codec.decode(frame)
        except protocol.ProtocolError as e:
            assert e.kind in ("undecodable", "invalid", "counters")


# ---- a frontend in a loop of its own, so that hypothesis can drive it from a plain test ----


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


@pytest.fixture
def harness() -> Iterator[Harness]:
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


def test_engine_socket_survives_fuzzed_frames(harness: Harness) -> None:
    """Fuzzed frames on the output socket: each undecodable one is counted once and dropped; no other
    counter moves (but the refused hellos'); the peer keeps serving."""
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(engine_addresses(harness.engine_address).outputs)
    before = harness.counters()
    sent = {"messages": 0, "bad": 0}

    @given(message=st.lists(frames(), min_size=1, max_size=3))
    @FUZZ
    def send(message: list[bytes]) -> None:
        decoded = _decodes(message[0]) if len(message) == 1 else None
        assume(
            not (isinstance(decoded, protocol.EngineHello) and decoded.engine_index == 0)
        )  # a real restart
        push.send_multipart(message)
        harness.run(asyncio.sleep(0.002))  # the frontend takes it
        sent["messages"] += 1
        sent["bad"] += decoded is None

    try:
        send()
    finally:
        context.destroy(linger=0)

    def errors() -> float:
        return sum(
            v for (name, _), v in harness.counters().items() if name == "openinfer:protocol_errors_total"
        )

    baseline = sum(v for (name, _), v in before.items() if name == "openinfer:protocol_errors_total")
    harness.run(wait_until(lambda: errors() - baseline >= sent["bad"], timeout=10))
    assert errors() - baseline <= sent["messages"]
    after = harness.counters()
    moved = {k for k in set(before) | set(after) if before.get(k, 0.0) != after.get(k, 0.0)}
    # A fuzzed hello whose tokenizer does not load is refused, and counted as refused too.
    allowed = {"openinfer:protocol_errors_total", "openinfer:engine_hellos_refused_total"}
    assert {name for name, _ in moved} <= allowed, moved
    assert harness.client.num_engines_up == 1
    harness.completes()


def test_fuzz_strategies_cover_valid_frames() -> None:
    """The unmutated bases decode (so mutations start from real messages of both directions)."""
    assert all(_decodes(frame) is not None for frame in _BASES[:4])
    assert msgspec.msgpack.decode(_BASES[4])[0] == "req"
