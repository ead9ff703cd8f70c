"""The handshake: checks on an engine's hello (its protocol version, its tokenizer, built once per distinct
one, the index it claims: :mod:`~openinfer.frontend.engines.index_claims`), refusals sent back, and hello
requests to incarnations heard from before their hello."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Annotated

import msgspec

from openinfer.frontend.engines.index_claims import IndexClaims, Join
from openinfer.frontend.engines.liveness import Liveness
from openinfer.frontend.engines.registry import MAX_ENGINES, EngineRegistry, Retirement
from openinfer.frontend.log_limit import LogRateLimiter
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.tokenizer import Tokenizer
from openinfer.protocol import (
    PROTOCOL_VERSION,
    EngineHello,
    EngineInput,
    HelloRefused,
    HelloRequest,
    ProtocolError,
    engine_identity,
)

logger = logging.getLogger(__name__)

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


class _HelloHead(msgspec.Struct, array_like=True):
    """The fields a hello of any protocol version starts with: ``["hello", protocol_version, ...]``, then the
    engine index and incarnation where ours has them (raw: another version may put anything there; empty
    when absent). Decoding it skips the rest of the frame without building anything: any frame at all comes
    here, up to the socket's size limit, and a generic decode of one array of 60 million nils builds a list
    of 60 million items (0.5 GB)."""

    tag: str
    protocol_version: int
    engine_index: msgspec.Raw = msgspec.Raw()
    incarnation: msgspec.Raw = msgspec.Raw()


_HELLO_HEAD = msgspec.msgpack.Decoder(_HelloHead)
_UINT64 = msgspec.msgpack.Decoder(Annotated[int, msgspec.Meta(ge=0)])  # msgpack holds none above 2**64 - 1
# What decoding a frame of any shape can raise (RecursionError: nesting deeper than msgspec's limit).
_NOT_DECODED = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def foreign_hello(frame: bytes | memoryview) -> tuple[int, int | None, int | None] | None:
    """(version, engine_index, incarnation) of a hello of another protocol version (index and incarnation
    None when that version does not put them where ours does)."""
    try:
        head = _HELLO_HEAD.decode(frame)
    except _NOT_DECODED:  # it does not start as a hello does
        return None
    if head.tag != "hello" or head.protocol_version == PROTOCOL_VERSION:
        return None
    index = _uint64(head.engine_index) if head.incarnation else None
    incarnation = _uint64(head.incarnation) if index is not None else None
    return head.protocol_version, index, incarnation


def _uint64(raw: msgspec.Raw) -> int | None:
    """The unsigned integer ``raw`` holds, or None when it holds anything else (or nothing)."""
    try:
        return _UINT64.decode(raw)
    except _NOT_DECODED:
        return None


def version_refusal(version: int, source: str) -> str:
    """What is logged (and counted as kind "version") when a hello speaks another protocol version."""
    return (
        f"refused a hello{source} speaking protocol version {version}; this frontend speaks version "
        f"{PROTOCOL_VERSION}: run the engine and the frontend from the same openinfer release"
    )


_ASK_INTERVAL_S = 1.0  # at most one HelloRequest (or repeated HelloRefused) a second per incarnation
_MAX_ASKS = 1024  # incarnations asked within the interval (strangers can name any number of them)


class IdentityThrottle:
    """When to tell an incarnation something again: ask one we have no hello from (we started after it) to
    say hello, or repeat a refusal to one that still sends (it may have missed the first)."""

    def __init__(self) -> None:
        self._asked: dict[bytes, float] = {}  # engine identity -> time.monotonic() of the last ask

    def should_ask(self, identity: bytes, now: float) -> bool:
        """True at most once per interval per identity (and then the ask counts as made)."""
        if now - self._asked.get(identity, -_ASK_INTERVAL_S) < _ASK_INTERVAL_S:
            return False
        if len(self._asked) >= _MAX_ASKS:
            self._asked = {key: t for key, t in self._asked.items() if now - t < _ASK_INTERVAL_S}
            if len(self._asked) >= _MAX_ASKS:
                return False  # a flood of names: this one is told on one of its next messages
        self._asked[identity] = now
        return True

    def answered(self, identity: bytes) -> None:
        """Its hello came."""
        self._asked.pop(identity, None)


# Sends one message to one engine identity; True once sent.
Send = Callable[[bytes, EngineInput], Awaitable[bool]]


class Handshake:
    """The frontend's side of the hello: refusals (with the reason sent back, logged and counted), tokenizers,
    claims on engine indices, hello requests."""

    def __init__(
        self, registry: EngineRegistry, send: Send, metrics: FrontendMetrics, liveness: Liveness, join: Join
    ) -> None:
        self._registry = registry
        self._send = send
        self._metrics = metrics
        self.claims = IndexClaims(registry, liveness, self._refuse, join)  # its run() is the caller's task
        self._tokenizers = TokenizerCache()
        self._asks = IdentityThrottle()
        self._refusal_repeats = IdentityThrottle()
        self._log = LogRateLimiter(logger)

    async def refuse_foreign(self, frame: bytes | memoryview) -> None:
        """A frame our codec cannot decode: if it is another version's hello, refuse it (both sides log why)
        and raise ``ProtocolError("version")``; otherwise return, and the caller re-raises its error."""
        foreign = foreign_hello(frame)
        if foreign is None:
            return
        version, index, incarnation = foreign
        refusal = version_refusal(version, f" from engine {index}" if index is not None else "")
        self._metrics.count_hello_refused(self._known(index), "version")
        if index is not None and incarnation is not None:
            await self._send(engine_identity(index, incarnation), HelloRefused(PROTOCOL_VERSION, refusal))
        raise ProtocolError("version", refusal)

    async def accept(self, hello: EngineHello, fd: int | None) -> Tokenizer | None:
        """The tokenizer of a hello to act on now: a repeat from the current incarnation, or one that may
        join. None when it is ignored (a retired incarnation) or its claim on the index waits or is refused.
        A hello of another version or with a broken tokenizer is refused and raises ``ProtocolError``."""
        index, incarnation = hello.engine_index, hello.incarnation
        identity = engine_identity(index, incarnation)
        self._asks.answered(identity)
        if self._registry.is_retired(index, incarnation):
            return None
        if hello.protocol_version != PROTOCOL_VERSION:
            refusal = version_refusal(hello.protocol_version, f" from engine {index}")
            await self._refuse(hello, "version", refusal)
            raise ProtocolError("version", refusal)
        try:
            tokenizer = self._tokenizers.get(hello.tokenizer_json, hello.tokenizer_config_json)
        except ValueError as e:
            refusal = f"refused engine {index}: {e}"
            await self._refuse(hello, "tokenizer", refusal)
            raise ProtocolError("tokenizer", refusal) from None
        if self._registry.current(index, incarnation) is not None:
            return tokenizer
        if not self._registry.has_room(index):
            refusal = (
                f"refused engine {index}: this frontend holds {MAX_ENGINES} engine indices, its limit; give "
                "the engine the index of one that is gone, or use another frontend"
            )
            self._log.warning("too_many_engines", "%s", refusal)
            await self._refuse(hello, "too_many_engines", refusal)
            return None
        return tokenizer if await self.claims.claim(hello, tokenizer, fd) else None

    async def unknown_sender(self, engine_index: int, incarnation: int) -> None:
        """A message from an incarnation that is not its index's current one (it is dropped): nothing for a
        replaced one or one whose claim waits; a refused one's is a protocol error ("refused"), and it is
        told again; one we have no hello from (we started after it) is asked for its hello."""
        if self.claims.is_contested(engine_index, incarnation):
            return
        identity = engine_identity(engine_index, incarnation)
        if self._registry.is_refused(engine_index, incarnation):
            self._metrics.count_protocol_error("refused")
            if self._refusal_repeats.should_ask(identity, time.monotonic()):
                message = f"engine {engine_index} incarnation {incarnation:016x} was refused: see the frontend's log"
                await self._send(identity, HelloRefused(PROTOCOL_VERSION, message))
            return
        if not self._registry.is_retired(engine_index, incarnation):
            await self.ask_for_hello(engine_index, incarnation)

    async def _refuse(self, hello: EngineHello, reason: str, refusal: str) -> None:
        """Count a hello's refusal under ``reason``, and :meth:`disown` its incarnation (the caller logs it)."""
        self._metrics.count_hello_refused(self._known(hello.engine_index), reason)
        await self.disown(hello.engine_index, hello.incarnation, refusal)

    async def disown(
        self, engine_index: int, incarnation: int, message: str, why: Retirement = Retirement.REFUSED
    ) -> None:
        """Retire an incarnation as refused or clashed (its messages are protocol errors, kind "refused", from
        now on) and tell it ``message`` with ``HelloRefused`` (an engine stops); a repeat waits a second."""
        identity = engine_identity(engine_index, incarnation)
        self._registry.retire(engine_index, incarnation, why)
        self._refusal_repeats.should_ask(identity, time.monotonic())
        await self._send(identity, HelloRefused(PROTOCOL_VERSION, message))

    async def ask_for_hello(self, engine_index: int, incarnation: int) -> None:
        """An incarnation we have no hello from (we started after it): ask it to say hello again."""
        identity = engine_identity(engine_index, incarnation)
        if not self._asks.should_ask(identity, time.monotonic()):
            return
        self._log.info(
            "unknown_sender",
            "engine %d incarnation %016x sent outputs but no hello; asking for one",
            engine_index,
            incarnation,
        )
        await self._send(identity, HelloRequest())

    def _known(self, engine_index: int | None) -> int | None:
        """The index a refusal is counted under: None (``engine="unknown"``) unless this frontend has a
        record of it, so that strangers naming many indices cannot add series."""
        known = engine_index is not None and self._registry.get(engine_index) is not None
        return engine_index if known else None
