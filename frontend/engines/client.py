"""The frontend's side of the engine boundary: the engine sockets and registry, routing, liveness, bounds."""

from __future__ import annotations

import asyncio
import logging
import time

from openinfer.frontend.addresses import engine_addresses
from openinfer.frontend.engines.handshake import TokenizerCache, foreign_hello, version_refusal
from openinfer.frontend.engines.liveness import TICK_S as LIVENESS_TICK_S
from openinfer.frontend.engines.liveness import Liveness
from openinfer.frontend.engines.registry import EngineRecord, EngineRegistry, ServedModel
from openinfer.frontend.engines.request_stream import RequestStream
from openinfer.frontend.engines.server_keys import CurveServerKeys
from openinfer.frontend.engines.sockets import EngineSockets, SocketEvent
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
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
    HelloRefused,
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
# A request that no engine streamed anything for yet moves to another engine when its engine dies, at most
# this many times in all.
_MAX_SENDS = 3
# Request ids remembered per engine as aborted there (late outputs of requests that ended here).
_MAX_ABORTED_IDS = 4096
# HelloRequest times remembered (strangers can name any number of incarnations).
_MAX_HELLO_REQUESTS = 1024


class NoEngineError(Exception):
    """No live engine serves the requested model (or has the requested index)."""


class EngineOverloadedError(Exception):
    """The frontend's bound on unfinished requests is reached (in total, or on every engine of the model)."""

    retry_after_s = 1  # what the HTTP answer's Retry-After says


class EngineCommandError(Exception):
    """A command reached no answer: the engine was unreachable, restarted, or the frontend is closing."""


class EngineClient:
    """Owns the engine sockets and registry, routes requests and streams their outputs back.

    ``bind_address`` is ``tcp://HOST:PORT``: requests leave through a ROUTER bound on PORT, outputs arrive on
    a PULL bound on PORT+1 (see :mod:`openinfer.frontend.addresses`).

    Liveness (DESIGN.md): an engine is marked down when it is silent for ``engine_timeout`` seconds, or
    when the connection its outputs came over closes and it is not heard from again within about a second
    (a killed process); its in-flight requests that got no output yet move to another live engine of the
    model, the others end with an error saying why. A new incarnation of an index ends the old one's the
    same way. One that comes back with the same incarnation (it was paused) is taken back; outputs it sends
    for requests that already ended here are dropped and those requests aborted on it.

    Bounds: at most ``max_queued_total`` unfinished requests in all and ``max_queued_per_engine`` per
    engine; past them :meth:`add_request` raises :class:`EngineOverloadedError` at once.
    """

    def __init__(
        self,
        bind_address: str,
        metrics: FrontendMetrics,
        engine_timeout: float = 5.0,
        max_queued_per_engine: int = 256,
        max_queued_total: int = 1024,
        curve_keys: CurveServerKeys | None = None,
    ) -> None:
        if engine_timeout <= 0:
            raise ValueError(f"engine_timeout must be positive, got {engine_timeout}")
        if max_queued_per_engine < 1 or max_queued_total < 1:
            raise ValueError("the bounds on queued requests must be >= 1")
        self.addresses = engine_addresses(bind_address)
        self.metrics = metrics
        self.engine_timeout = engine_timeout
        self.max_queued_per_engine = max_queued_per_engine
        self.max_queued_total = max_queued_total
        self.registry = EngineRegistry()
        self._curve_keys = curve_keys
        self._requests: dict[str, RequestStream] = {}
        self._input_codec = EngineInputCodec()
        self._output_codec = EngineOutputCodec()
        self._tokenizers = TokenizerCache()
        self._liveness = Liveness(engine_timeout)
        self._hello_requested: dict[bytes, float] = {}  # engine identity -> monotonic time of the last ask
        self._sockets: EngineSockets | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._resends: set[asyncio.Task[None]] = set()
        self._last_warning: dict[str, float] = {}  # kind -> monotonic time of the last such warning

    # ---- lifecycle ----

    async def start(self) -> None:
        """Bind both sockets and start receiving; raises ``zmq.ZMQError`` if a port is taken."""
        self._sockets = EngineSockets(self.addresses, self._curve_keys)
        self._sockets.bind()
        self._tasks = [
            asyncio.create_task(self._receive_loop(), name="engine-client-receive"),
            asyncio.create_task(self._stray_loop(), name="engine-client-strays"),
            asyncio.create_task(self._event_loop(), name="engine-client-events"),
            asyncio.create_task(self._liveness_loop(), name="engine-client-liveness"),
        ]
        curve = ", CurveZMQ" if self._curve_keys is not None else ""
        logger.info("engine sockets bound: requests %s, outputs %s%s", *self.addresses, curve)

    async def close(self) -> None:
        """Abort every in-flight request on its engine, end it with an error, close the sockets."""
        for task in [*self._tasks, *self._resends]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._resends, return_exceptions=True)
        self._tasks = []
        for record in self.registry.records():
            if record.in_flight:
                await self._send(record.identity, AbortRequests(list(record.in_flight)))
            for stream in list(record.in_flight.values()):
                self._finish(record, stream, "the frontend is shutting down")
            self._end_commands(record, "the frontend is shutting down")
        if self._sockets is not None:
            self._sockets.close()
            self._sockets = None

    # ---- what the API asks ----

    @property
    def num_engines_up(self) -> int:
        return len(self.registry.live())

    @property
    def num_queued(self) -> int:
        """Unfinished requests of this frontend, on all engines."""
        return len(self._requests)

    def served_models(self) -> list[ServedModel]:
        """Models served by live engines, in order of their lowest engine index."""
        return self.registry.served_models()

    def served_model(self, name: str) -> ServedModel | None:
        return next((model for model in self.served_models() if model.name == name), None)

    async def add_request(self, request: EngineCoreRequest, model_name: str) -> RequestStream:
        """Send ``request`` to the least-loaded live engine serving ``model_name``.

        Raises :class:`NoEngineError` if none serves it, :class:`EngineOverloadedError` past the bounds on
        queued requests. The stream always ends with an output carrying ``finish``: the engine's, or an
        error made here when the engine dies or cannot be reached.
        """
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        if len(self._requests) >= self.max_queued_total:
            raise EngineOverloadedError(
                f"the server holds {len(self._requests)} unfinished requests, its limit "
                "(--max-queued-total); retry later"
            )
        record = self.registry.pick(model_name, self.max_queued_per_engine)
        if record is None:
            if not self.registry.serves(model_name):
                raise NoEngineError(f"no live engine serves model {model_name!r}")
            raise EngineOverloadedError(
                f"every engine serving {model_name!r} holds {self.max_queued_per_engine} unfinished "
                "requests, its limit (--max-queued-per-engine); retry later"
            )
        stream = RequestStream(request.request_id, record.index, model_name, request)
        self._requests[request.request_id] = stream
        self._assign(record, stream)
        try:
            await self._deliver(record, stream)
        except asyncio.CancelledError:  # the client left while we waited for the engine to be routable
            self._finish(record, stream, "cancelled before it reached the engine")
            raise
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
        assert self._sockets is not None
        while True:
            frames, fd = await self._sockets.receive_output()
            try:
                await self._handle_frames([frame.buffer for frame in frames], fd)
            except ProtocolError as e:
                self.metrics.count_protocol_error(e.kind)
                logger.warning("dropped a bad frame from an engine: %s", e)
            except Exception:  # noqa: BLE001 - one bad message must never stop the frontend
                logger.exception("error while handling an engine message; it was dropped")

    async def _stray_loop(self) -> None:
        """Engines never send on the request socket: anything arriving there is counted and dropped."""
        assert self._sockets is not None
        while True:
            frames = await self._sockets.receive_stray()
            self.metrics.count_protocol_error("unexpected")
            if self._log_allowed("unexpected"):
                peer = bytes(frames[0][:40]) if frames else b""
                logger.warning(
                    "dropped a message from %r on the request socket, where engines never send", peer
                )

    async def _handle_frames(self, frames: list[memoryview], fd: int | None) -> None:
        if len(frames) != 1:
            raise ProtocolError("frames", f"expected one frame per message, got {len(frames)}")
        try:
            message = self._output_codec.decode(frames[0])
        except ProtocolError:
            foreign = foreign_hello(frames[0])
            if foreign is not None:
                version, index, incarnation = foreign
                refusal = version_refusal(version, f" from engine {index}" if index is not None else "")
                if index is not None and incarnation is not None:
                    await self._refuse(engine_identity(index, incarnation), refusal)
                raise ProtocolError("version", refusal) from None
            raise
        if isinstance(message, EngineHello):
            await self._on_hello(message, fd)
        elif isinstance(message, EngineCoreOutputs):
            await self._on_outputs(message, fd)
        else:
            await self._on_drafter_reply(message, fd)

    async def _refuse(self, identity: bytes, refusal: str) -> None:
        """Tell a refused engine why, so that its log says so too (DESIGN.md: a clear line on both sides)."""
        await self._send(identity, HelloRefused(PROTOCOL_VERSION, refusal))

    async def _on_hello(self, hello: EngineHello, fd: int | None) -> None:
        index, incarnation = hello.engine_index, hello.incarnation
        self._hello_requested.pop(engine_identity(index, incarnation), None)
        if self.registry.is_retired(index, incarnation):
            return
        if hello.protocol_version != PROTOCOL_VERSION:
            self.registry.retire(index, incarnation)
            refusal = version_refusal(hello.protocol_version, f" from engine {index}")
            await self._refuse(engine_identity(index, incarnation), refusal)
            raise ProtocolError("version", refusal)
        try:
            tokenizer = self._tokenizers.get(hello.tokenizer_json, hello.tokenizer_config_json)
        except ValueError as e:
            self.registry.retire(index, incarnation)
            raise ProtocolError("tokenizer", f"refused engine {index}: {e}") from None

        record = self.registry.current(index, incarnation)
        if record is not None:  # a hello we asked for again, or a repeat
            if hello.seq <= record.last_seq:
                raise ProtocolError(
                    "seq", f"engine {index} sent a hello of seq {hello.seq} after {record.last_seq}"
                )
            record.hello, record.tokenizer, record.last_seq = hello, tokenizer, hello.seq
            record.num_spec_tokens = hello.num_spec_tokens
            self._heard_from(record, hello.load, fd)
            return
        record = EngineRecord(
            hello,
            tokenizer,
            time.monotonic(),
            hello.seq,
            hello.load,
            num_spec_tokens=hello.num_spec_tokens,
            fd=fd,
        )
        previous = self.registry.install(record)
        self.metrics.engine_joined(index, incarnation)
        kv = f"{hello.kv_num_blocks} KV blocks of {hello.kv_block_size} tokens"
        spec = f"{hello.num_spec_tokens} spec tokens" if hello.num_spec_tokens else "no speculation"
        logger.info("%s joined: max_model_len %d, %s, %s", record.describe(), hello.max_model_len, kv, spec)
        self.metrics.set_engine_up(index, True)
        self.metrics.observe_load(index, incarnation, record.model_name, hello.load)
        if previous is not None:
            logger.warning("%s restarted as incarnation %016x", previous.describe(), incarnation)
            if previous.model_name != record.model_name:
                self.metrics.forget_load(index, previous.model_name)
            self._end_commands(previous, f"{previous.describe()} restarted before it answered")
            self._end_requests(previous, f"{previous.describe()} restarted")

    async def _on_outputs(self, message: EngineCoreOutputs, fd: int | None) -> None:
        record = await self._sender(message, fd)
        if record is None:
            return
        strays = [output.request_id for output in message.outputs if not self._route(record, output)]
        if strays:
            await self._abort_strays(record, strays)

    async def _on_drafter_reply(self, reply: DrafterReply, fd: int | None) -> None:
        record = await self._sender(reply, fd)
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

    async def _sender(self, message: EngineCoreOutputs | DrafterReply, fd: int | None) -> EngineRecord | None:
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
        self._heard_from(record, message.load, fd)
        return record

    def _heard_from(self, record: EngineRecord, load: LoadSnapshot, fd: int | None) -> None:
        """Any message of a current incarnation: it is alive, and this is its load now."""
        record.last_seen = time.monotonic()
        record.load = load
        record.sent_since_snapshot = 0
        if fd is not None:
            record.fd = fd
        if not record.up:
            record.up = True
            record.disconnected_at = None
            logger.info("%s is back", record.describe())
            self.metrics.set_engine_up(record.index, True)
        self.metrics.observe_load(record.index, record.incarnation, record.model_name, record.load)

    def _route(self, record: EngineRecord, output: EngineCoreOutput) -> bool:
        """Hand an output to its request's stream; False when the request is not in flight on ``record``."""
        stream = record.in_flight.get(output.request_id)
        if stream is None:
            return output.finish is not None  # a finished one needs no abort
        if output.finish is not None:
            del record.in_flight[output.request_id]
            self._requests.pop(output.request_id, None)
        stream.put(output)
        return True

    async def _abort_strays(self, record: EngineRecord, request_ids: list[str]) -> None:
        """An engine sends outputs for requests that ended here (it was paused past the timeout, or an
        earlier frontend sent them): abort them there, once each."""
        new = [request_id for request_id in request_ids if request_id not in record.aborted]
        if not new:
            return
        if len(record.aborted) + len(new) > _MAX_ABORTED_IDS:
            record.aborted.clear()
        record.aborted.update(new)
        logger.info(
            "%s sent outputs for %d requests that ended here; aborting them", record.describe(), len(new)
        )
        await self._send(record.identity, AbortRequests(new))

    async def _ask_for_hello(self, engine_index: int, incarnation: int) -> None:
        """An incarnation we have no hello from (we started after it): ask it to say hello again."""
        identity = engine_identity(engine_index, incarnation)
        identity_parts = (engine_index, incarnation)
        now = time.monotonic()
        if now - self._hello_requested.get(identity, -_HELLO_REQUEST_INTERVAL_S) < _HELLO_REQUEST_INTERVAL_S:
            return
        self._hello_requested[identity] = now
        if len(self._hello_requested) > _MAX_HELLO_REQUESTS:  # strangers can name any number of them
            self._hello_requested = {
                key: asked
                for key, asked in self._hello_requested.items()
                if now - asked < _HELLO_REQUEST_INTERVAL_S
            }
        logger.info("engine %d incarnation %016x sent outputs but no hello; asking for one", *identity_parts)
        await self._send(identity, HelloRequest())

    # ---- liveness ----

    async def _event_loop(self) -> None:
        assert self._sockets is not None
        async for event in self._sockets.events():
            self._on_socket_event(event)

    def _on_socket_event(self, event: SocketEvent) -> None:
        if not event.disconnected:
            self.metrics.count_protocol_error("handshake")
            if self._log_allowed("handshake"):
                logger.warning(
                    "a peer failed the handshake on the %s socket (errno %d): a wrong or missing CurveZMQ "
                    "key, or not a ZeroMQ peer",
                    event.socket,
                    event.value,
                )
            return
        if event.socket != "outputs":
            return  # requests connections say nothing of who they were; the outputs one is enough
        for record in self._liveness.connection_closed(self.registry.live(), event.value, time.monotonic()):
            logger.info("%s: its output connection closed", record.describe())

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(LIVENESS_TICK_S)
            now = time.monotonic()
            for record in self.registry.live():
                verdict = self._liveness.verdict(record, now)
                if verdict is not None:
                    await self._mark_down(record, *verdict)

    async def _mark_down(self, record: EngineRecord, why: str, connected: bool) -> None:
        """Down, its requests moved or ended; a still ``connected`` one is told to drop them (if it comes
        back, say from SIGSTOP, it must not go on with them; a disconnected one is aborted on its outputs)."""
        logger.warning("%s is down: %s", record.describe(), why)
        record.up = False
        record.disconnected_at = None
        self.metrics.set_engine_up(record.index, False)
        self.metrics.forget_load(record.index, record.model_name)
        if record.in_flight and connected:
            record.aborted.update(record.in_flight)
            await self._send(record.identity, AbortRequests(list(record.in_flight)))
        self._end_requests(record, f"{record.describe()} stopped responding: {why}")
        # Drafter commands keep waiting: loading a drafter can stall an engine; they time out on their own.

    # ---- helpers ----

    def _log_allowed(self, kind: str) -> bool:
        """At most one warning a second per kind of noise a stranger can make (it is counted anyway)."""
        now = time.monotonic()
        if now - self._last_warning.get(kind, -1.0) < 1.0:
            return False
        self._last_warning[kind] = now
        return True

    def _end_requests(self, record: EngineRecord, reason: str) -> None:
        """Move its requests that got no output yet to another engine; end the others with an error."""
        for stream in list(record.in_flight.values()):
            del record.in_flight[stream.request_id]
            target = None
            if not stream.started and stream.num_sends < _MAX_SENDS:
                target = self.registry.pick(stream.model_name, self.max_queued_per_engine)
            if target is None:
                self._finish(record, stream, reason)
                continue
            logger.info(
                "request %s moves from engine %d to engine %d", stream.request_id, record.index, target.index
            )
            self._assign(target, stream)
            task = asyncio.create_task(self._deliver(target, stream, reason))
            self._resends.add(task)
            task.add_done_callback(self._resends.discard)

    def _assign(self, record: EngineRecord, stream: RequestStream) -> None:
        """Put ``stream`` in flight on ``record`` (at once, so that the bounds see it)."""
        stream.engine_index = record.index
        stream.num_sends += 1
        record.in_flight[stream.request_id] = stream
        record.sent_since_snapshot += 1

    async def _deliver(self, record: EngineRecord, stream: RequestStream, why_moved: str = "") -> None:
        """Send an assigned request; it ends with an error if that fails (unless it moved on meanwhile)."""
        assert stream.request is not None
        sent = await self._send(record.identity, stream.request, patience=_SEND_PATIENCE_S)
        if not sent and record.in_flight.get(stream.request_id) is stream:
            reason = f"{record.describe()} is not connected to the request socket"
            self._finish(record, stream, f"{why_moved}; then {reason}" if why_moved else reason)

    def _end_commands(self, record: EngineRecord, reason: str) -> None:
        for waiter in record.commands.values():
            if not waiter.done():
                waiter.set_exception(EngineCommandError(reason))
        record.commands.clear()

    def _finish(self, record: EngineRecord, stream: RequestStream, message: str) -> None:
        record.in_flight.pop(stream.request_id, None)
        self._requests.pop(stream.request_id, None)
        stream.fail(message)

    async def _send(self, identity: bytes, message: EngineInput, patience: float = 0.0) -> bool:
        """Send to one engine, retrying for ``patience`` seconds while it is unroutable; True once sent."""
        if self._sockets is None:
            return False
        error = await self._sockets.send(identity, self._input_codec.encode(message), patience)
        if error is not None:
            logger.warning("could not send %s to %s: %s", type(message).__name__, identity.decode(), error)
        return error is None
