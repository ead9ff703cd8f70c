"""The frontend's side of the engine boundary: two bound ZMQ sockets, the engine registry, request routing."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

import msgspec
import zmq
import zmq.asyncio

from openinfer.frontend.addresses import engine_addresses
from openinfer.frontend.engine_registry import EngineRecord, EngineRegistry, ServedModel
from openinfer.frontend.metrics import FrontendMetrics
from openinfer.frontend.request_stream import RequestStream
from openinfer.frontend.tokenizer import Tokenizer
from openinfer.protocol import (
    PROTOCOL_VERSION,
    AbortRequests,
    DrafterReply,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineHello,
    EngineInput,
    EngineInputCodec,
    EngineOutputCodec,
    FinishReason,
    HelloRequest,
    LoadDrafter,
    LoadSnapshot,
    ProtocolError,
    UnloadDrafter,
    engine_identity,
)

logger = logging.getLogger(__name__)

# How long a new request waits for its engine's DEALER to be routable: the hello comes over the PUSH socket
# and can beat the DEALER's connection to the ROUTER.
_SEND_PATIENCE_S = 2.0
# At most one HelloRequest per second to an engine incarnation we have no hello from.
_HELLO_REQUEST_INTERVAL_S = 1.0


class NoEngineError(Exception):
    """No live engine serves the requested model (or has the requested index)."""


class EngineCommandError(Exception):
    """A command reached no answer: the engine was unreachable, restarted, or the frontend is closing."""


class EngineClient:
    """Owns the engine sockets and registry, routes requests and streams their outputs back.

    ``bind_address`` is ``tcp://HOST:PORT``: requests leave through a ROUTER bound on PORT, outputs arrive on
    a PULL bound on PORT+1 (see :mod:`openinfer.frontend.addresses`). An engine silent for ``engine_timeout``
    seconds is marked down and its in-flight requests end with an error; so do those of an incarnation that
    is replaced by a new one for the same index.
    """

    def __init__(self, bind_address: str, metrics: FrontendMetrics, engine_timeout: float = 5.0) -> None:
        if engine_timeout <= 0:
            raise ValueError(f"engine_timeout must be positive, got {engine_timeout}")
        self.addresses = engine_addresses(bind_address)
        self.metrics = metrics
        self.engine_timeout = engine_timeout
        self.registry = EngineRegistry()
        self._requests: dict[str, RequestStream] = {}
        self._input_codec = EngineInputCodec()
        self._output_codec = EngineOutputCodec()
        self._tokenizers: dict[bytes, Tokenizer] = {}  # by digest of the tokenizer files
        self._hello_requested: dict[bytes, float] = {}  # engine identity -> monotonic time of the last ask
        self._context: zmq.asyncio.Context | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._pull: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ---- lifecycle ----

    async def start(self) -> None:
        """Bind both sockets and start receiving; raises ``zmq.ZMQError`` if a port is taken."""
        self._context = zmq.asyncio.Context()
        self._router = self._context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unroutable send raises instead of vanishing
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting engine takes its identity back
        self._router.setsockopt(zmq.SNDHWM, 0)  # requests are small; never drop or block on a slow engine
        self._router.setsockopt(zmq.LINGER, 0)
        self._pull = self._context.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        try:
            self._router.bind(self.addresses.requests)
            self._pull.bind(self.addresses.outputs)
        except zmq.ZMQError:
            self._context.destroy(linger=0)
            raise
        self._tasks = [
            asyncio.create_task(self._receive_loop(), name="engine-client-receive"),
            asyncio.create_task(self._monitor_loop(), name="engine-client-monitor"),
        ]
        logger.info("engine sockets bound: requests %s, outputs %s", *self.addresses)

    async def close(self) -> None:
        """Abort every in-flight request on its engine, end it with an error, close the sockets."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for record in self.registry.records():
            if record.in_flight:
                await self._send(record.identity, AbortRequests(list(record.in_flight)))
            self._end_requests(record, "the frontend is shutting down")
            self._end_commands(record, "the frontend is shutting down")
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = self._router = self._pull = None

    # ---- what the API asks ----

    @property
    def num_engines_up(self) -> int:
        return len(self.registry.live())

    def served_models(self) -> list[ServedModel]:
        """Models served by live engines, in order of their lowest engine index."""
        return self.registry.served_models()

    def served_model(self, name: str) -> ServedModel | None:
        return next((model for model in self.served_models() if model.name == name), None)

    async def add_request(self, request: EngineCoreRequest, model_name: str) -> RequestStream:
        """Send ``request`` to the least-loaded live engine serving ``model_name`` (NoEngineError if none).

        The stream always ends with an output carrying ``finish``: the engine's, or an error made here when
        the engine dies or cannot be reached.
        """
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        record = self.registry.pick(model_name)
        if record is None:
            raise NoEngineError(f"no live engine serves model {model_name!r}")
        stream = RequestStream(request.request_id, record.index, model_name)
        self._requests[request.request_id] = stream
        record.in_flight[request.request_id] = stream
        record.sent_since_snapshot += 1
        try:
            sent = await self._send(record.identity, request, patience=_SEND_PATIENCE_S)
        except asyncio.CancelledError:  # the client left while we waited for the engine to be routable
            self._finish(record, stream, "cancelled before it reached the engine")
            raise
        if not sent:
            self._finish(record, stream, f"{record.describe()} is not connected to the request socket")
        return stream

    async def drafter_command(
        self, engine_index: int, command: LoadDrafter | UnloadDrafter, timeout: float
    ) -> DrafterReply:
        """Send a drafter command to a live engine and wait for its :class:`DrafterReply` (any ``ok``).

        Raises :class:`NoEngineError` for an unknown or down index, :class:`EngineCommandError` when the
        command cannot be sent or the engine restarts first, ``TimeoutError`` after ``timeout`` seconds.
        """
        record = self.registry.get(engine_index)
        if record is None or not record.up:
            known = ", ".join(str(r.index) for r in self.registry.live()) or "none"
            raise NoEngineError(f"engine {engine_index} is not connected (engines up: {known})")
        reply: asyncio.Future[DrafterReply] = asyncio.get_running_loop().create_future()
        record.commands[command.command_id] = reply
        try:
            if not await self._send(record.identity, command, patience=_SEND_PATIENCE_S):
                raise EngineCommandError(f"{record.describe()} is not connected to the request socket")
            async with asyncio.timeout(timeout):
                return await reply
        finally:
            record.commands.pop(command.command_id, None)

    async def abort(self, request_id: str) -> None:
        """Stop a request on its engine (the client went away); unknown or finished ids are ignored."""
        stream = self._requests.pop(request_id, None)
        if stream is None:
            return
        stream.put(EngineCoreOutput(request_id, [], FinishReason("abort", message="aborted by the frontend")))
        record = self.registry.get(stream.engine_index)
        if record is not None and record.in_flight.pop(request_id, None) is not None:
            await self._send(record.identity, AbortRequests([request_id]))

    # ---- receiving ----

    async def _receive_loop(self) -> None:
        assert self._pull is not None
        while True:
            frames = await self._pull.recv_multipart()
            try:
                await self._handle_frames(frames)
            except ProtocolError as e:
                self.metrics.count_protocol_error(e.kind)
                logger.warning("dropped a bad frame from an engine: %s", e)
            except Exception:  # noqa: BLE001 - one bad message must never stop the frontend
                logger.exception("error while handling an engine message; it was dropped")

    async def _handle_frames(self, frames: list[bytes]) -> None:
        if len(frames) != 1:
            raise ProtocolError("frames", f"expected one frame per message, got {len(frames)}")
        try:
            message = self._output_codec.decode(frames[0])
        except ProtocolError:
            version = _foreign_hello_version(frames[0])
            if version is not None:
                raise ProtocolError("version", _version_refusal(version, "")) from None
            raise
        if isinstance(message, EngineHello):
            await self._on_hello(message)
        elif isinstance(message, EngineCoreOutputs):
            await self._on_outputs(message)
        else:
            await self._on_drafter_reply(message)

    async def _on_hello(self, hello: EngineHello) -> None:
        index, incarnation = hello.engine_index, hello.incarnation
        self._hello_requested.pop(engine_identity(index, incarnation), None)
        if self.registry.is_retired(index, incarnation):
            return
        if hello.protocol_version != PROTOCOL_VERSION:
            self.registry.retire(index, incarnation)
            raise ProtocolError("version", _version_refusal(hello.protocol_version, f" from engine {index}"))
        try:
            tokenizer = self._tokenizer(hello.tokenizer_json, hello.tokenizer_config_json)
        except ValueError as e:
            self.registry.retire(index, incarnation)
            raise ProtocolError("tokenizer", f"refused engine {index}: {e}") from None

        record = self.registry.current(index, incarnation)
        if record is not None:  # a hello we asked for again, or a repeat
            record.hello, record.tokenizer, record.last_seq = hello, tokenizer, hello.seq
            record.num_spec_tokens = hello.num_spec_tokens
            self._heard_from(record, hello.load)
            return
        record = EngineRecord(
            hello, tokenizer, time.monotonic(), hello.seq, hello.load, num_spec_tokens=hello.num_spec_tokens
        )
        previous = self.registry.install(record)
        if previous is not None:
            logger.warning("%s restarted as incarnation %016x", previous.describe(), incarnation)
            self.metrics.count_engine_restart(index)
            self._end_requests(previous, f"{previous.describe()} restarted")
            self._end_commands(previous, f"{previous.describe()} restarted before it answered")
            self.metrics.forget_load(index, previous.model_name)
        kv = f"{hello.kv_num_blocks} KV blocks of {hello.kv_block_size} tokens"
        spec = f"{hello.num_spec_tokens} spec tokens" if hello.num_spec_tokens else "no speculation"
        logger.info("%s joined: max_model_len %d, %s, %s", record.describe(), hello.max_model_len, kv, spec)
        self.metrics.set_engine_up(index, True)
        self.metrics.observe_load(index, incarnation, record.model_name, hello.load)

    async def _on_outputs(self, message: EngineCoreOutputs) -> None:
        record = await self._sender(message)
        if record is None:
            return
        for output in message.outputs:
            self._route(record, output)

    async def _on_drafter_reply(self, reply: DrafterReply) -> None:
        record = await self._sender(reply)
        if record is None:
            return
        record.num_spec_tokens = reply.num_spec_tokens
        waiter = record.commands.pop(reply.command_id, None)
        if waiter is None or waiter.done():
            logger.info(
                "%s answered command %s, which no one awaits now", record.describe(), reply.command_id
            )
            return
        waiter.set_result(reply)

    async def _sender(self, message: EngineCoreOutputs | DrafterReply) -> EngineRecord | None:
        """The current record of a message's sender, with its load taken; None (dropped) if there is none."""
        index, incarnation = message.engine_index, message.incarnation
        record = self.registry.current(index, incarnation)
        if record is None:
            if not self.registry.is_retired(index, incarnation):
                await self._ask_for_hello(index, incarnation)
            return None
        if message.seq <= record.last_seq:
            raise ProtocolError("seq", f"engine {index} sent seq {message.seq} after seq {record.last_seq}")
        record.last_seq = message.seq
        self._heard_from(record, message.load)
        return record

    def _heard_from(self, record: EngineRecord, load: LoadSnapshot) -> None:
        """Any message of a current incarnation: it is alive, and this is its load now."""
        record.last_seen = time.monotonic()
        record.load = load
        record.sent_since_snapshot = 0
        if not record.up:
            record.up = True
            logger.info("%s is back", record.describe())
            self.metrics.set_engine_up(record.index, True)
        self.metrics.observe_load(record.index, record.incarnation, record.model_name, record.load)

    def _route(self, record: EngineRecord, output: EngineCoreOutput) -> None:
        stream = record.in_flight.get(output.request_id)
        if stream is None:
            logger.debug("dropped output, unknown request %s from engine %d", output.request_id, record.index)
            return
        if output.finish is not None:
            del record.in_flight[output.request_id]
            self._requests.pop(output.request_id, None)
        stream.put(output)

    async def _ask_for_hello(self, engine_index: int, incarnation: int) -> None:
        """An incarnation we have no hello from (we started after it): ask it to say hello again."""
        identity = engine_identity(engine_index, incarnation)
        identity_parts = (engine_index, incarnation)
        now = time.monotonic()
        if now - self._hello_requested.get(identity, -_HELLO_REQUEST_INTERVAL_S) < _HELLO_REQUEST_INTERVAL_S:
            return
        self._hello_requested[identity] = now
        logger.info("engine %d incarnation %016x sent outputs but no hello; asking for one", *identity_parts)
        await self._send(identity, HelloRequest())

    # ---- liveness ----

    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(min(self.engine_timeout / 5, 0.5))
            now = time.monotonic()
            for record in self.registry.live():
                if now - record.last_seen > self.engine_timeout:
                    await self._mark_down(record)

    async def _mark_down(self, record: EngineRecord) -> None:
        silence = f"sent nothing for {self.engine_timeout:g} s"
        logger.warning("%s left: it %s", record.describe(), silence)
        record.up = False
        self.metrics.set_engine_up(record.index, False)
        self.metrics.forget_load(record.index, record.model_name)
        if record.in_flight:  # if it ever comes back it must not keep working on them
            await self._send(record.identity, AbortRequests(list(record.in_flight)))
        self._end_requests(record, f"{record.describe()} stopped responding (it {silence})")
        # Drafter commands keep waiting: loading a drafter can stall an engine; they time out on their own.

    # ---- helpers ----

    def _end_requests(self, record: EngineRecord, reason: str) -> None:
        for stream in list(record.in_flight.values()):
            self._finish(record, stream, reason)

    def _end_commands(self, record: EngineRecord, reason: str) -> None:
        for waiter in record.commands.values():
            if not waiter.done():
                waiter.set_exception(EngineCommandError(reason))
        record.commands.clear()

    def _finish(self, record: EngineRecord, stream: RequestStream, message: str) -> None:
        record.in_flight.pop(stream.request_id, None)
        self._requests.pop(stream.request_id, None)
        stream.fail(message)

    def _tokenizer(self, tokenizer_json: bytes, tokenizer_config_json: bytes) -> Tokenizer:
        """One Tokenizer per distinct pair of files: building one from a big tokenizer.json takes a while."""
        digest = hashlib.blake2b(tokenizer_json + b"\0" + tokenizer_config_json, digest_size=16).digest()
        if digest not in self._tokenizers:
            self._tokenizers[digest] = Tokenizer(tokenizer_json, tokenizer_config_json)
        return self._tokenizers[digest]

    async def _send(self, identity: bytes, message: EngineInput, patience: float = 0.0) -> bool:
        """Send to one engine, retrying for ``patience`` seconds while it is unroutable; True once sent."""
        assert self._router is not None
        payload = self._input_codec.encode(message)
        deadline = time.monotonic() + patience
        while True:
            try:
                await self._router.send_multipart([identity, payload], flags=zmq.DONTWAIT)
                return True
            except zmq.ZMQError as e:  # EHOSTUNREACH: its DEALER is not connected (yet)
                if time.monotonic() >= deadline:
                    name = type(message).__name__
                    logger.warning("could not send %s to %s: %s", name, identity.decode(), e)
                    return False
            await asyncio.sleep(0.02)


def _foreign_hello_version(frame: bytes) -> int | None:
    """The protocol version of a hello from another protocol version that our codec cannot decode."""
    try:
        raw = msgspec.msgpack.decode(frame)
    except msgspec.DecodeError:
        return None
    # A hello is encoded as ["hello", protocol_version, ...] in every version (tag first, then the version).
    if isinstance(raw, list) and len(raw) >= 2 and raw[0] == "hello" and isinstance(raw[1], int):
        return raw[1] if raw[1] != PROTOCOL_VERSION else None
    return None


def _version_refusal(version: int, source: str) -> str:
    return (
        f"refused a hello{source} speaking protocol version {version}; this frontend speaks version "
        f"{PROTOCOL_VERSION}: run the engine and the frontend from the same openinfer release"
    )
