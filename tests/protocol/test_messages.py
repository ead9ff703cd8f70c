"""Round trips of every wire message and typed errors for bad frames."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from openinfer.protocol import (
    PROTOCOL_VERSION,
    AbortRequests,
    DrafterReply,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineHello,
    EngineInputCodec,
    EngineOutputCodec,
    FinishReason,
    HelloRefused,
    HelloRequest,
    LoadDrafter,
    LoadSnapshot,
    ProtocolError,
    SamplingParams,
    SpecDecodeCounters,
    TokenLogprobs,
    UnloadDrafter,
    engine_identity,
)

Z3 = [0, 0, 0]


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
    EngineCoreRequest("r3", [7, 8], SamplingParams(max_tokens=4, logprobs=5)),
    EngineCoreRequest("r4", [7], SamplingParams(max_tokens=4, seed=1, logprobs=0)),
    EngineCoreRequest(
        "r5",
        [7],
        SamplingParams(
            max_tokens=4,
            presence_penalty=0.5,
            frequency_penalty=-1.0,
            repetition_penalty=1.2,
            min_tokens=2,
            logit_bias={5: -100.0, 9: 2.5},
            bad_words_token_ids=[[3], [4, 5]],
            min_p=0.1,
        ),
    ),
    AbortRequests(["r1", "r2"]),
    HelloRequest(),
    LoadDrafter("c1", "ngram", 7, prompt_lookup_min=2, prompt_lookup_max=5),
    LoadDrafter("c2", "dflash", 7, draft_model="/models/dflash"),
    UnloadDrafter("c3"),
    HelloRefused(2, "this frontend speaks protocol version 2"),
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
        # drafts of 3 accepting 1 and 2 (reaching positions 0-1 and 0-2), rated 0.9, 0.6 and 0.9, 0.5, 0.4
        make_load(
            SpecDecodeCounters(
                3, 2, 6, 3, [2, 1, 0], [0, 1, 1, 0], [2, 2, 2], 1, [2, 2, 1], [1_800_000, 1_100_000, 400_000]
            )
        ),
    ),
    EngineCoreOutputs(
        0,
        1,
        2,
        3.0,
        [
            EngineCoreOutput(
                "r4",
                [1, 2, 3],
                FinishReason("length"),
                spec_stats=SpecDecodeCounters(
                    3,
                    2,
                    5,
                    3,
                    [2, 1, 0],
                    [0, 1, 1, 0],
                    [2, 2, 1],
                    1,
                    [2, 2, 1],
                    [1_700_000, 900_000, 300_000],
                ),
            ),
        ],
        make_load(),
    ),
    EngineCoreOutputs(
        0,
        1,
        3,
        4.0,
        [
            EngineCoreOutput(
                "r5",
                [8, 9],
                logprobs=[
                    TokenLogprobs(-0.25, [8, 3], [-0.25, -1.5]),
                    TokenLogprobs(-3.0, [2, 9], [-0.1, -3.0]),
                ],
            ),
            EngineCoreOutput("r6", [4], FinishReason("length"), logprobs=[TokenLogprobs(float("-inf"))]),
        ],
        make_load(),
    ),
    DrafterReply(0, 42, 9, "c1", True, "loaded ngram K=7", 7, make_load(SpecDecodeCounters.zero(7))),
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


def test_old_sampling_params_and_outputs_still_decode() -> None:
    """The fields added at the end are optional on the wire: a frame without them decodes to the defaults."""
    old_request = msgspec.msgpack.encode(["req", "r1", [1, 2], [5, 0.5]])
    decoded = EngineInputCodec().decode(old_request)
    assert isinstance(decoded, EngineCoreRequest) and decoded.sampling_params.logprobs is None
    old_outputs = msgspec.msgpack.encode(["out", 0, 1, 1, 1.0, [["r1", [4], None, 0, None]], [0, 1, 0, 0]])
    decoded_outputs = EngineOutputCodec().decode(old_outputs)
    assert isinstance(decoded_outputs, EngineCoreOutputs)
    assert decoded_outputs.outputs == [EngineCoreOutput("r1", [4])]


@pytest.mark.parametrize(
    "logprobs",
    [
        [TokenLogprobs(-1.0)],  # two tokens, one entry
        [TokenLogprobs(-1.0, [1], [-1.0]), TokenLogprobs(-1.0, [1, 2], [-1.0, -2.0])],  # k differs
        [TokenLogprobs(-1.0, [1, 2], [-1.0]), TokenLogprobs(-1.0, [1, 2], [-1.0])],  # ids without logprobs
        [TokenLogprobs(-1.0, [-1], [-1.0]), TokenLogprobs(-1.0, [1], [-1.0])],  # negative token id
    ],
)
def test_logprobs_that_do_not_fit_the_tokens_are_rejected(logprobs: list[TokenLogprobs]) -> None:
    """An output's logprobs must have one entry per new token, all with the same k."""
    codec = EngineOutputCodec()
    bad = EngineCoreOutputs(0, 1, 1, 1.0, [EngineCoreOutput("r", [1, 2], logprobs=logprobs)], make_load())
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


@pytest.mark.parametrize(
    "counters",
    [
        SpecDecodeCounters(
            3, 1, 3, 2, [1, 2, 0], [0, 0, 1, 0], [1, 1, 1], 0, [1, 1, 1], Z3
        ),  # per_pos increases
        SpecDecodeCounters(
            3, 1, 3, 2, [1, 1, 0], [0, 1, 0, 0], [1, 1, 1], 0, [1, 1, 1], Z3
        ),  # hist: 1, per_pos: 2
        SpecDecodeCounters(
            3, 1, 4, 0, [0, 0, 0], [1, 0, 0, 0], [1, 1, 1], 0, [1, 0, 0], Z3
        ),  # 4 tokens > K * 1
        SpecDecodeCounters(33, 0, 0, 0, [0] * 33, [0] * 34, [0] * 33, 0, [0] * 33, [0] * 33),  # K past 32
        SpecDecodeCounters(3, 0, 0, 0, [0, 0], [0, 0, 0, 0], [0, 0, 0], 0, Z3, Z3),  # per_pos too short
        SpecDecodeCounters(3, 1, 3, 2, [1, 1, 0], [0, 0, 1, 0]),  # protocol version 2's: no verified per pos
        SpecDecodeCounters(3, 1, 3, 2, [1, 1, 0], [0, 0, 1, 0], [1, 1, 1], 0),  # version 3's: no reached
        SpecDecodeCounters(
            3, 1, 2, 0, [0, 0, 0], [1, 0, 0, 0], [1, 0, 1], 0, [1, 0, 0], Z3
        ),  # verified increases
        SpecDecodeCounters(
            3, 2, 3, 0, [0, 0, 0], [2, 0, 0, 0], [1, 1, 1], 0, [2, 0, 0], Z3
        ),  # verified[0] != 2
        SpecDecodeCounters(
            3, 1, 2, 0, [0, 0, 0], [1, 0, 0, 0], [1, 0, 0], 0, [1, 0, 0], Z3
        ),  # sum(verified) != 2
        SpecDecodeCounters(
            3, 2, 3, 3, [1, 1, 1], [1, 0, 0, 1], [2, 1, 0], 0, [2, 1, 1], Z3
        ),  # position 2 accepted, not verified
        SpecDecodeCounters(3, 0, 0, 0, Z3, [0, 0, 0, 0], Z3, -1, Z3, Z3),  # negative unverified
        # one draft of 3 tokens, 1 accepted, reaches [1, 1, 0]:
        SpecDecodeCounters(3, 1, 3, 1, [1, 0, 0], [0, 1, 0, 0], [1, 1, 1], 0, [1, 1], [0, 0]),  # too short
        SpecDecodeCounters(
            3, 1, 3, 1, [1, 0, 0], [0, 1, 0, 0], [1, 1, 1], 0, [2, 1, 0], Z3
        ),  # reached[0] != 1
        SpecDecodeCounters(
            3, 1, 3, 2, [1, 1, 0], [0, 0, 1, 0], [1, 1, 1], 0, [1, 0, 0], Z3
        ),  # 1 accepted, unreached
        SpecDecodeCounters(
            3, 1, 3, 1, [1, 0, 0], [0, 1, 0, 0], [1, 1, 1], 0, [1, 1, 1], Z3
        ),  # 2 after 1 rejected
        SpecDecodeCounters(
            3, 1, 2, 1, [1, 0, 0], [0, 1, 0, 0], [1, 1, 0], 0, [1, 1, 1], Z3
        ),  # 2 never verified
        SpecDecodeCounters(
            3, 1, 3, 1, [1, 0, 0], [0, 1, 0, 0], [1, 1, 1], 0, [1, 1, 0], [1_000_001, 0, 0]
        ),  # a confidence above 1
        SpecDecodeCounters(
            3, 1, 3, 1, [1, 0, 0], [0, 1, 0, 0], [1, 1, 1], 0, [1, 1, 0], [500_000, 500_000, 1]
        ),  # a confidence where no draft reached
        SpecDecodeCounters(
            3, 1, 3, 1, [1, 0, 0], [0, 1, 0, 0], [1, 1, 1], 0, [1, 1, 0], [500_000, -1, 0]
        ),  # a negative confidence sum
    ],
)
def test_impossible_counters_are_protocol_errors(counters: SpecDecodeCounters) -> None:
    """A snapshot whose counters break an invariant of docs/design.md is rejected as kind "counters"."""
    codec = EngineOutputCodec()
    frame = codec.encode(EngineCoreOutputs(0, 1, 1, 1.0, [], make_load(counters)))
    with pytest.raises(ProtocolError) as info:
        codec.decode(frame)
    assert info.value.kind == "counters"


def test_impossible_request_stats_are_protocol_errors() -> None:
    """Per-request spec stats that do not add up are rejected."""
    codec = EngineOutputCodec()
    bad = EngineCoreOutput(
        "r",
        [1],
        FinishReason("length"),
        spec_stats=SpecDecodeCounters(3, 1, 3, 2, [1, 1, 0], [1, 0, 0, 0], [1, 1, 1], 0, [1, 1, 1], Z3),
    )
    with pytest.raises(ProtocolError):
        codec.decode(codec.encode(EngineCoreOutputs(0, 1, 1, 1.0, [bad], make_load())))
