"""Fuzzing (hypothesis, bounded): the wire decoders and the frontend's engine socket on arbitrary and mutated
frames, every HTTP route on arbitrary bodies and headers. Nothing crashes, no 5xx but 503, no counter moves
but the protocol-error one, and the server still serves afterwards."""

from __future__ import annotations

import asyncio

import msgspec
import zmq
from hypothesis import assume, given
from hypothesis import strategies as st

from openinfer import protocol
from openinfer.frontend.addresses import engine_addresses
from tests.frontend.fuzz_harness import FUZZ, Harness
from tests.frontend.waits import wait_until


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
