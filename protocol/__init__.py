"""Wire messages, codecs and counter types shared by the engine and the frontend (no torch, aiohttp, zmq)."""

from openinfer.protocol.codec import EngineInputCodec, EngineOutputCodec, ProtocolError
from openinfer.protocol.messages import (
    MAX_SPEC_TOKENS,
    PROTOCOL_VERSION,
    AbortRequests,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineHello,
    EngineInput,
    EngineOutput,
    FinishReason,
    HelloRequest,
    LoadSnapshot,
    SamplingParams,
    SpecDecodeCounters,
    engine_identity,
)

__all__ = [
    "MAX_SPEC_TOKENS",
    "PROTOCOL_VERSION",
    "AbortRequests",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreRequest",
    "EngineHello",
    "EngineInput",
    "EngineInputCodec",
    "EngineOutput",
    "EngineOutputCodec",
    "FinishReason",
    "HelloRequest",
    "LoadSnapshot",
    "ProtocolError",
    "SamplingParams",
    "SpecDecodeCounters",
    "engine_identity",
]
