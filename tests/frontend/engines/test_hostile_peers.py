"""Peers that are not the engines they claim to be, through real ZMQ sockets: two processes sending as one
incarnation, forged hellos on many indices, and the log lines any peer can provoke."""

from __future__ import annotations

import asyncio
import logging
import tracemalloc
from collections.abc import AsyncIterator

import msgspec
import pytest
import zmq
import zmq.asyncio

from openinfer.frontend.addresses import engine_addresses
from openinfer.frontend.engines.handshake import foreign_hello
from openinfer.frontend.engines.registry import MAX_ENGINES, EngineRegistry, Retirement
from openinfer.frontend.engines.request_stream import RequestStream
from openinfer.frontend.log_limit import LogRateLimiter
from openinfer.protocol import (
    PROTOCOL_VERSION,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineOutputCodec,
    SpecDecodeCounters,
)
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.engines.engine_requests import make_request
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.waits import wait_until


def sample(frontend: Frontend, name: str, **labels: str) -> float:
    return frontend.metrics.registry.get_sample_value(name, labels) or 0.0


def engine_labels(frontend: Frontend) -> set[str]:
    """The engine label values of every series /metrics exports."""
    return {
        s.labels["engine"]
        for m in frontend.metrics.registry.collect()
        for s in m.samples
        if "engine" in s.labels
    }


@pytest.fixture
async def stranger() -> AsyncIterator[zmq.asyncio.Context]:
    """A context for sockets of a process that is not an engine (destroyed at teardown)."""
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def push_to(context: zmq.asyncio.Context, frontend: Frontend) -> zmq.asyncio.Socket:
    push = context.socket(zmq.PUSH)
    push.connect(engine_addresses(frontend.engine_address).outputs)
    return push


async def test_a_seq_ahead_of_the_engine_retires_its_incarnation(
    start_frontend: FrontendFactory, start_peer: PeerFactory, stranger: zmq.asyncio.Context
) -> None:
    """A stranger sends as a live incarnation with seq 2^63-1: the engine's own messages, whose seqs are
    then behind, are dropped and counted (kind "seq") and, as they go on, taken for two processes sending as
    one incarnation: the streamed request ends with an error saying so, the engine is told (HelloRefused) and
    the incarnation retired (engine_up 0, its next messages kind "refused"); a new incarnation of the index
    is taken at once, as a restart."""
    frontend = await start_frontend(engine_timeout=30.0)
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05))
    stream = await frontend.client.add_request(make_request("r1", max_tokens=500), "tiny")
    await anext(stream)
    push = await push_to(stranger, frontend)
    forged = EngineCoreOutputs(0, peer.incarnation, 2**63 - 1, 0.0, [], peer._load())
    await push.send(EngineOutputCodec().encode(forged))

    outputs = await asyncio.wait_for(collect(stream), timeout=10)
    finish = outputs[-1].finish
    assert finish is not None and finish.kind == "error"
    assert "two processes send as this incarnation" in (finish.message or "")
    await wait_until(lambda: len(peer.refusals) == 1)
    assert "two processes send as this incarnation" in peer.refusals[0]
    assert frontend.client.registry.current(0, peer.incarnation) is None
    assert sample(frontend, "openinfer:engine_up", engine="0") == 0
    assert sample(frontend, "openinfer:protocol_errors_total", kind="seq") >= 2  # a run of them, 1 s long
    await wait_until(lambda: sample(frontend, "openinfer:protocol_errors_total", kind="refused") >= 1)

    await peer.restart()
    await wait_until(lambda: frontend.client.num_engines_up == 1)
    assert sample(frontend, "openinfer:engine_restarts_total", engine="0") == 1
    stream = await frontend.client.add_request(make_request("r2"), "tiny")
    assert len(await collect(stream)) == 3


async def collect(stream: RequestStream) -> list[EngineCoreOutput]:
    return [output async for output in stream]


async def test_forged_hellos_on_many_indices_are_bounded_then_forgotten(
    start_frontend: FrontendFactory, stranger: zmq.asyncio.Context
) -> None:
    """Hellos (with spec-decode counters) for MAX_ENGINES + 20 indices, then the stranger's connection closes:
    MAX_ENGINES records, the other 20 refused and counted under engine "unknown"; once the records are seen
    dead, no record and no series of those indices remain (their baselines are kept, as forgotten ones)."""
    frontend = await start_frontend(engine_timeout=60.0)  # never reached: the close ends the records
    push = await push_to(stranger, frontend)
    template = EnginePeer(frontend.engine_address, PeerConfig(spec=SpecDecodeCounters.zero(3)))
    codec = EngineOutputCodec()
    indices = range(1000, 1000 + MAX_ENGINES + 20)
    for index in indices:
        template.config.engine_index, template.incarnation = index, index
        await push.send(codec.encode(template.hello(0)))
    refused = {"engine": "unknown", "reason": "too_many_engines"}
    await wait_until(lambda: sample(frontend, "openinfer:engine_hellos_refused_total", **refused) == 20)
    assert len(frontend.client.registry.records()) == MAX_ENGINES
    assert len(engine_labels(frontend)) == MAX_ENGINES + 1  # and "unknown", of the refusals

    push.close(linger=0)  # the records' connection: each must be heard from again within 1 s, or it is down
    await wait_until(lambda: frontend.client.registry.records() == [], timeout=10)
    assert engine_labels(frontend) == {"unknown"}
    state = frontend.metrics.state()
    accepted = set(indices[:MAX_ENGINES])  # the first MAX_ENGINES got records, in the order sent
    assert set(state.forgotten) == set(state.spec_baselines) == set(state.incarnations) == accepted


async def test_an_index_with_history_is_kept_when_a_forged_hello_goes_silent(
    start_frontend: FrontendFactory, start_peer: PeerFactory, stranger: zmq.asyncio.Context
) -> None:
    """Engine 0 served and died; a stranger's hello takes index 0 (a restart, counted) and goes silent: the
    index is down but not forgotten, since its counters moved (exported counters never go down)."""
    frontend = await start_frontend(engine_timeout=0.5)
    peer = await start_peer(frontend)
    stream = await frontend.client.add_request(make_request("r1"), "tiny")
    assert len([output async for output in stream]) == 3
    await peer.stop()
    await wait_until(lambda: frontend.client.num_engines_up == 0)
    push = await push_to(stranger, frontend)
    forged = EnginePeer(frontend.engine_address)
    await push.send(EngineOutputCodec().encode(forged.hello(0)))
    await wait_until(lambda: frontend.client.registry.current(0, forged.incarnation) is not None)
    await wait_until(lambda: frontend.client.num_engines_up == 0)
    await wait_until(lambda: sample(frontend, "openinfer:engine_restarts_total", engine="0") == 1)
    record = frontend.client.registry.get(0)
    assert record is not None and record.incarnation == forged.incarnation and not record.up
    assert sample(frontend, "openinfer:engine_up", engine="0") == 0


def test_log_rate_limiter_lets_a_burst_then_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """``burst`` lines of a kind at once, then one per interval, the next saying how many were held back;
    another kind has its own budget."""
    now = [0.0]
    limiter = LogRateLimiter(logging.getLogger("test.limit"), interval_s=1.0, burst=3, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.limit"):
        for i in range(10):
            limiter.warning("a", "a %d", i)
        limiter.info("b", "b")
        now[0] = 0.5
        limiter.warning("a", "a %d", 10)  # half a line of budget back: not yet
        now[0] = 1.0
        limiter.warning("a", "a %d", 11)
    assert caplog.messages == ["a 0", "a 1", "a 2", "b", "a 11 [8 more like this were not logged]"]


def test_a_foreign_hello_is_read_only_as_far_as_its_head() -> None:
    """A frame the codec refused is looked at as another version's hello without building its values: an
    array of 8 million nils, bare or after a foreign hello's tag and version, allocates under 64 KiB (a
    generic decode builds a list of 8 million items, 64 MB); index and incarnation are read where given."""
    n = 8 * 2**20
    array = b"\xdd" + n.to_bytes(4, "big")  # msgpack array32 header
    nils = array + b"\xc0" * n
    foreign = array + msgspec.msgpack.encode("hello") + msgspec.msgpack.encode(98) + b"\xc0" * (n - 2)
    tracemalloc.start()
    try:
        assert foreign_hello(nils) is None
        assert foreign_hello(foreign) == (98, None, None)  # nil where the index and incarnation go
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**16, peak
    assert foreign_hello(msgspec.msgpack.encode(["hello", 98, 5, 2**64 - 1, b"tokenizer"])) == (
        98,
        5,
        2**64 - 1,
    )
    assert foreign_hello(msgspec.msgpack.encode(["hello", 98, 5])) == (98, None, None)  # no incarnation
    assert foreign_hello(msgspec.msgpack.encode(["hello", 98, -1, 7])) == (98, None, None)
    assert foreign_hello(msgspec.msgpack.encode(["hello", PROTOCOL_VERSION, 5, 7])) is None  # ours
    assert foreign_hello(b"\x91" * 100_000 + b"\xc0") is None  # nested past msgspec's depth


def test_a_clashed_incarnation_is_never_evicted_by_other_retirements() -> None:
    """Strangers' hellos can retire any number of incarnations (refused, replaced), evicting the oldest
    of those; an incarnation retired for a seq clash is kept apart and stays refused."""
    registry = EngineRegistry()
    registry.retire(0, 1, Retirement.CLASHED)
    registry.retire(0, 2, Retirement.REPLACED)
    for incarnation in range(5000):
        registry.retire(1, incarnation, Retirement.REFUSED)
    assert registry.is_retired(0, 1) and registry.is_refused(0, 1)
    assert not registry.is_retired(0, 2)  # the oldest replaced one went
    assert registry.is_refused(1, 4999) and not registry.is_retired(1, 0)
