"""Encoders and decoders, one pair per socket direction, and the typed error for bad frames."""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

from openinfer.protocol.messages import (
    DrafterReply,
    EngineCoreOutputs,
    EngineHello,
    EngineInput,
    EngineOutput,
    LoadSnapshot,
    TokenLogprobs,
)

T = TypeVar("T")


class ProtocolError(ValueError):
    """A frame that does not decode, or decodes to something impossible.

    ``kind`` is a short label for ``openinfer:protocol_errors_total{kind}``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class _Codec(Generic[T]):
    """msgpack for one socket direction's messages (a tagged union, ``T``)."""

    def __init__(self, type_: object) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(type_)

    def encode(self, message: T) -> bytes:
        return self._encoder.encode(message)

    def decode(self, frame: bytes | memoryview) -> T:
        """Decode one frame; raise :class:`ProtocolError` (never anything else) when it is bad."""
        try:
            message: T = self._decoder.decode(frame)
        except msgspec.ValidationError as e:
            raise ProtocolError("invalid", str(e)) from None
        except msgspec.DecodeError as e:
            raise ProtocolError("undecodable", str(e)) from None
        except Exception as e:  # noqa: BLE001 - a hostile frame must never escape as anything else
            raise ProtocolError("undecodable", f"{type(e).__name__}: {e}") from None
        _check(message)
        return message


def _check(message: object) -> None:
    """Reject values that decode but cannot be true."""
    if isinstance(message, EngineCoreOutputs | EngineHello | DrafterReply):
        if message.seq < 0 or message.engine_index < 0:
            raise ProtocolError("invalid", "negative seq or engine_index")
        _check_load(message.load)
    if isinstance(message, EngineCoreOutputs):
        for output in message.outputs:
            violation = output.spec_stats.violation() if output.spec_stats is not None else None
            if violation is not None:
                raise ProtocolError(
                    "invalid", f"impossible spec stats for request {output.request_id}: {violation}"
                )
            if output.logprobs is not None and not _logprobs_ok(output.logprobs, len(output.new_token_ids)):
                raise ProtocolError("invalid", f"logprobs that do not fit the tokens of {output.request_id}")
    if isinstance(message, EngineHello) and (message.kv_block_size <= 0 or message.max_model_len <= 0):
        raise ProtocolError("invalid", "non-positive block size or model length in hello")


def _check_load(load: LoadSnapshot) -> None:
    if min(load.kv_used_blocks, load.kv_total_blocks, load.num_running_reqs, load.num_waiting_reqs) < 0:
        raise ProtocolError("invalid", "negative load value")
    if load.kv_used_blocks > load.kv_total_blocks:
        raise ProtocolError("invalid", "more KV blocks used than exist")
    if load.spec_decode is not None:
        violation = load.spec_decode.violation()
        if violation is not None:
            raise ProtocolError("counters", violation)
    if load.prefix_cache is not None:
        violation = load.prefix_cache.violation()
        if violation is not None:
            raise ProtocolError("counters", violation)


def _logprobs_ok(logprobs: list[TokenLogprobs], num_tokens: int) -> bool:
    """One entry per new token, each with as many top logprobs as top token ids (and the same k)."""
    return len(logprobs) == num_tokens and all(
        len(entry.top_token_ids) == len(entry.top_logprobs) == len(logprobs[0].top_token_ids)
        and min(entry.top_token_ids, default=0) >= 0
        for entry in logprobs
    )


class EngineInputCodec(_Codec[EngineInput]):
    """Frontend -> engine (ROUTER -> DEALER): requests, aborts, hello requests."""

    def __init__(self) -> None:
        super().__init__(EngineInput)


class EngineOutputCodec(_Codec[EngineOutput]):
    """Engine -> frontend (PUSH -> PULL): the hello, outputs and heartbeats."""

    def __init__(self) -> None:
        super().__init__(EngineOutput)
