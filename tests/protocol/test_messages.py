"""Round trips of every wire message and typed errors for bad frames."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from openinfer.protocol import (
    PROTOCOL_VERSION,
    AbortRequests,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineHello,
    EngineInputCodec,
    EngineOutputCodec,
    FinishReason,
    HelloRequest,
    LoadSnapshot,
    ProtocolError,
    SamplingParams,
    SpecDecodeCounters,
    engine_identity,
)


def make_load(spec: SpecDecodeCounters | None = None) -> LoadSnapshot:
    return LoadSnapshot(
        kv_used_blocks=3, kv_total_blocks=10, num_running_reqs=2, num_waiting_reqs=1, spec_decode=spec
    )


INPUTS = [
    EngineCoreRequest("r1", [1, 2, 3], SamplingParams(max_tokens=5)),
    EngineCoreRequest(
        "r2",
        [7],
        SamplingParams(
            max_tokens=1, temperature=0.7, top_p=0.9, top_k=40, seed=3, stop_token_ids=[9], ignore_eos=True
        ),
        arrival_time=12.5,
    ),
    AbortRequests(["r1", "r2"]),
    HelloRequest(),
]

OUTPUTS = [
    EngineCoreOutputs(0, 2**64 - 1, 1, 1.5, [], make_load()),
    EngineCoreOutputs(
        1,
        42,
        7,
        2.0,
        [
            EngineCoreOutput("r1", [4, 5]),
            EngineCoreOutput("r2", [6], FinishReason("stop", stop_token_id=6)),
            EngineCoreOutput("r3", [], FinishReason("error", message="the prompt is empty")),
        ],
        make_load(SpecDecodeCounters(3, 2, 6, 3, [2, 1, 0], [0, 1, 1, 0])),
    ),
    EngineHello(PROTOCOL_VERSION, 0, 42, 0, "tiny", 2048, 16, 100, None, 512, [0], b"{}", b"{}", make_load()),
]


@pytest.mark.parametrize("message", INPUTS, ids=lambda m: type(m).__name__)
def test_engine_input_round_trip(message: object) -> None:
    """Every frontend -> engine message decodes to an equal value."""
    codec = EngineInputCodec()
    assert codec.decode(codec.encode(message)) == message  # type: ignore[arg-type]


@pytest.mark.parametrize("message", OUTPUTS, ids=lambda m: type(m).__name__)
def test_engine_output_round_trip(message: object) -> None:
    """Every engine -> frontend message decodes to an equal value."""
    codec = EngineOutputCodec()
    assert codec.decode(codec.encode(message)) == message  # type: ignore[arg-type]


def test_directions_do_not_cross() -> None:
    """An output frame is not a valid input frame and vice versa (tagged unions per direction)."""
    with pytest.raises(ProtocolError):
        EngineInputCodec().decode(EngineOutputCodec().encode(OUTPUTS[0]))
    with pytest.raises(ProtocolError):
        EngineOutputCodec().decode(EngineInputCodec().encode(INPUTS[0]))


def test_impossible_values_are_rejected() -> None:
    """Frames that decode but cannot be true (negative load, used > total) are protocol errors."""
    codec = EngineOutputCodec()
    bad = msgspec.structs.replace(OUTPUTS[0], load=LoadSnapshot(11, 10, 0, 0))
    with pytest.raises(ProtocolError) as info:
        codec.decode(codec.encode(bad))
    assert info.value.kind == "invalid"


@given(st.binary(max_size=200))
def test_garbage_is_a_protocol_error(frame: bytes) -> None:
    """Arbitrary bytes either decode to a valid message or raise ProtocolError, never anything else."""
    for codec in (EngineInputCodec(), EngineOutputCodec()):
        try:
            codec.decode(frame)
        except ProtocolError:
            pass


def test_truncated_frames_are_protocol_errors() -> None:
    """Every strict prefix of a real frame is rejected with a typed error."""
    codec = EngineOutputCodec()
    frame = codec.encode(OUTPUTS[1])
    for n in range(len(frame)):
        with pytest.raises(ProtocolError):
            codec.decode(frame[:n])


def test_engine_identity_is_unique_per_incarnation() -> None:
    """Routing ids differ across indices and incarnations."""
    assert engine_identity(0, 1) != engine_identity(0, 2) != engine_identity(1, 1)
