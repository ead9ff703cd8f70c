"""Checks on an engine's hello: its protocol version, and its tokenizer (built once per distinct one)."""

from __future__ import annotations

import hashlib

import msgspec

from openinfer.frontend.tokenizer import Tokenizer
from openinfer.protocol import PROTOCOL_VERSION

_MAX_TOKENIZERS = 16  # kept, most recently used; strangers could send any number of them


class TokenizerCache:
    """One :class:`Tokenizer` per distinct pair of tokenizer files: building one from a big tokenizer.json
    takes a while, and every engine of a model sends the same."""

    def __init__(self) -> None:
        self._tokenizers: dict[bytes, Tokenizer] = {}  # by digest, the most recently used last

    def get(self, tokenizer_json: bytes, tokenizer_config_json: bytes) -> Tokenizer:
        """The tokenizer of these files; ``ValueError`` when they do not make one."""
        digest = hashlib.blake2b(tokenizer_json + b"\0" + tokenizer_config_json, digest_size=16).digest()
        tokenizer = self._tokenizers.pop(digest, None) or Tokenizer(tokenizer_json, tokenizer_config_json)
        self._tokenizers[digest] = tokenizer
        if len(self._tokenizers) > _MAX_TOKENIZERS:
            del self._tokenizers[next(iter(self._tokenizers))]
        return tokenizer


def foreign_hello_version(frame: bytes | memoryview) -> int | None:
    """The protocol version of a hello from another protocol version that our codec cannot decode."""
    foreign = foreign_hello(frame)
    return foreign[0] if foreign is not None else None


def foreign_hello(frame: bytes | memoryview) -> tuple[int, int | None, int | None] | None:
    """(version, engine_index, incarnation) of a hello of another protocol version (index and incarnation
    None when that version does not put them where ours does)."""
    try:
        raw = msgspec.msgpack.decode(frame)
    except Exception:  # noqa: BLE001 - any frame at all may come here; it is then simply not a hello
        return None
    # A hello is encoded as ["hello", protocol_version, ...] in every version (tag first, then the version).
    if not (isinstance(raw, list) and len(raw) >= 2 and raw[0] == "hello" and isinstance(raw[1], int)):
        return None
    if raw[1] == PROTOCOL_VERSION:
        return None
    index = raw[2] if len(raw) > 3 and isinstance(raw[2], int) and raw[2] >= 0 else None
    incarnation = raw[3] if index is not None and isinstance(raw[3], int) and 0 <= raw[3] < 2**64 else None
    return raw[1], index, incarnation


def version_refusal(version: int, source: str) -> str:
    """What is logged (and counted as kind "version") when a hello speaks another protocol version."""
    return (
        f"refused a hello{source} speaking protocol version {version}; this frontend speaks version "
        f"{PROTOCOL_VERSION}: run the engine and the frontend from the same openinfer release"
    )
