"""Frames a stranger sends to a frontend's engine ports: garbage of each kind the frontend counts, and a forged
engine's hello and counters."""

from __future__ import annotations

import time

import msgspec

from openinfer.engine_core.builtin_model import builtin_tokenizer_folder
from openinfer.protocol import (
    PROTOCOL_VERSION,
    EngineCoreOutputs,
    EngineHello,
    EngineOutputCodec,
    LoadSnapshot,
    SpecDecodeCounters,
)

# Garbage of each kind the frontend counts, as frames sent on the outputs port.
GARBAGE = {
    "undecodable": [b"\xc1garbage"],
    "invalid": [msgspec.msgpack.encode(["out", 0, 1])],  # an outputs message missing its fields
    "frames": [b"one", b"two"],
    "version": [msgspec.msgpack.encode(["hello", 98])],  # another version's hello, naming no engine
}


def forged_messages() -> list[bytes]:
    """A hello that would register engine 5, then counters that would publish drafts, if they got in."""
    folder = builtin_tokenizer_folder()
    spec = SpecDecodeCounters.zero(3)
    load = LoadSnapshot(0, 64, 0, 0, spec)
    hello = EngineHello(
        PROTOCOL_VERSION, 5, 77, 0, "fake", 2048, 16, 64, 3, 512, [0],
        (folder / "tokenizer.json").read_bytes(), (folder / "tokenizer_config.json").read_bytes(), load,
    )  # fmt: skip
    grown = spec.copy()
    grown.observe_draft(3, 3)
    outputs = EngineCoreOutputs(5, 77, 1, time.time(), [], LoadSnapshot(0, 64, 0, 0, grown))
    codec = EngineOutputCodec()
    return [codec.encode(hello), codec.encode(outputs)]
