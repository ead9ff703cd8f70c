"""The frontend's side of the engine boundary: the engine sockets and registry, routing, liveness, bounds."""

from __future__ import annotations

import asyncio
import logging
import time

from openinfer import protocol
from openinfer.frontend.addresses import engine_addresses
from openinfer.frontend.engines.departures import Departures
from openinfer.frontend.engines.drafter_commands import DrafterCommands
from openinfer.frontend.engines.errors import NoEngineError
from openinfer.frontend.engines.handshake import Handshake
from openinfer.frontend.engines.liveness import Liveness, LivenessWatch
from openinfer.frontend.engines.registry import EngineRecord, EngineRegistry, ServedModel, kept_hello
from openinfer.frontend.engines.request_stream import RequestStream
from openinfer.frontend.engines.router import Router
from openinfer.frontend.engines.server_keys import CurveServerKeys
from openinfer.frontend.engines.sockets import EngineSockets
from openinfer.frontend.log_limit import LogRateLimiter
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# How long a new request waits for its engine's DEALER to be routable: the hello comes over the PUSH socket
# and can beat the DEALER's connection to the ROUTER.
_SEND_PATIENCE_S = 2.0


class EngineClient:
    """Owns the engine sockets and registry, routes requests and streams their outputs back.

    ``bind_address`` is ``tcp://HOST:PORT``: requests leave through a ROUTER bound on PORT, outputs arrive on
    a PULL bound on PORT+1 (see :mod:`openinfer.frontend.addresses`).

    Liveness (docs/design.md): an engine is down when silent for ``engine_timeout`` seconds, or when the
    connection its outputs came over closes and it is not heard from again within about a second (a killed
    process); its in-flight requests that got no output yet move to another live engine of the model, the
    others end with an error saying why (:mod:`~openinfer.frontend.engines.departures`). A new incarnation
    of an index ends the old one's the same way, once the old one no longer holds the index
    (:mod:`~openinfer.frontend.engines.index_claims`). One back with the same incarnation (it was paused)
    is taken back; its outputs for requests that already ended here are dropped and aborted on it.

    Several frontends over the same engines: each gets its own requests' outputs; only the engine's metrics
    frontend (its hello's ``exports_metrics``) publishes the engine's counters and gauges.

    Bounds: at most ``max_queued_total`` unfinished requests in all and ``max_queued_per_engine`` per
    engine; past them :meth:`add_request` raises :class:`EngineOverloadedError` at once. In-flight requests
    live in one map, :attr:`router` (:class:`~openinfer.frontend.engines.router.Router`).
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
        self.addresses = engine_addresses(bind_address)
        self.metrics = metrics
        self.engine_timeout = engine_timeout
        self.registry = EngineRegistry()
        self.router = Router(self.registry, max_queued_per_engine, max_queued_total)
        self._commands = DrafterCommands(self.registry, self._send, _SEND_PATIENCE_S)
        self._curve_keys = curve_keys
        self._input_codec = protocol.EngineInputCodec()
        self._output_codec = protocol.EngineOutputCodec()
        liveness = Liveness(engine_timeout)
        self._handshake = Handshake(self.registry, self._send, metrics, liveness, self._join)
        self._log = LogRateLimiter(logger)  # every line here but start and close, a peer can provoke
        self._departures = Departures(
            self.registry, self.router, metrics, self._handshake, self._send, self._deliver
        )
        self._watch = LivenessWatch(self.registry, liveness, metrics, self._departures.mark_down)
        self._sockets: EngineSockets | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ---- lifecycle ----

    async def start(self) -> None:
        """Bind both sockets and start receiving; raises ``zmq.ZMQError`` if a port is taken."""
        self._sockets = EngineSockets(self.addresses, self._curve_keys)
        self._sockets.bind()
        self._tasks = [
            asyncio.create_task(self._receive_loop(), name="engine-client-receive"),
            asyncio.create_task(self._stray_loop(), name="engine-client-strays"),
            asyncio.create_task(self._watch.watch_events(self._sockets), name="engine-client-events"),
            asyncio.create_task(self._watch.run(), name="engine-client-liveness"),
            asyncio.create_task(self._handshake.claims.run(), name="engine-client-claims"),
        ]
        curve = ", CurveZMQ" if self._curve_keys is not None else ""
        logger.info("engine sockets bound: requests %s, outputs %s%s", *self.addresses, curve)

    async def crashed(self) -> str:
        """Wait until one of the client's own tasks ends before :meth:`close` (a bug: they handle every peer's
        error), and say which and why: a frontend that no longer reads its engines must stop, not go on deaf.
        Call it while the client runs (the frontend's main waits on it beside its stop signal)."""
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        task = done.pop()  # each runs until close() cancels it: ending before is a failure
        if task.cancelled():
            return f"{task.get_name()} was cancelled"
        return f"{task.get_name()} failed: {task.exception()!r}"

    async def close(self) -> None:
        """Abort every in-flight request on its engine, end it with an error, close the sockets."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._departures.close()
        for record in self.registry.records():
            in_flight = self.router.on_engine(record)
            if in_flight:
                await self._send(record.identity, protocol.AbortRequests(list(in_flight)))
            for stream in in_flight.values():
                self.router.fail(stream, "the frontend is shutting down")
            DrafterCommands.end(record, "the frontend is shutting down")
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
        return len(self.router)

    def served_models(self) -> list[ServedModel]:
        """Models served by live engines, in order of their lowest engine index."""
        return self.registry.served_models()

    def served_model(self, name: str) -> ServedModel | None:
        return next((model for model in self.served_models() if model.name == name), None)

    async def add_request(
        self, request: protocol.EngineCoreRequest, model_name: str, prefer: int | None = None
    ) -> RequestStream:
        """Send ``request`` to engine ``prefer`` when it can take it, else to the least-loaded live engine
        serving ``model_name``.

        Raises :class:`NoEngineError` if none serves it or it could not be sent (its engine is not connected
        to the request socket, or died meanwhile), :class:`EngineOverloadedError` past the bounds on queued
        requests. The stream always ends with an output carrying ``finish``: the engine's, or an error made
        here when the engine dies later. Nothing admitted outlives a failure here: the request leaves the
        router whatever is raised (a bug, a value the wire cannot hold, the caller's cancellation).
        """
        record, stream = self.router.admit(request, model_name, prefer)
        try:
            await self._deliver(record, stream)
        except BaseException:  # the client left while we waited for the engine to be routable, or a bug
            self.router.fail(stream, "cancelled or failed before it reached its engine")
            raise
        # Done already means failed before any engine ran it (an engine's answer cannot have come: this has not
        # yielded to the event loop since the send), so there is nothing to stream but why; a retry may work.
        if stream.done:
            finish = [output async for output in stream][-1].finish
            raise NoEngineError(finish.message if finish is not None and finish.message else "not sent")
        return stream

    async def drafter_command(
        self, engine_index: int, command: protocol.LoadDrafter | protocol.UnloadDrafter, timeout: float
    ) -> protocol.DrafterReply:
        """See :meth:`DrafterCommands.run <openinfer.frontend.engines.drafter_commands.DrafterCommands.run>`."""
        return await self._commands.run(engine_index, command, timeout)

    async def abort(self, request_id: str) -> None:
        """Stop a request on its engine (the client went away); unknown or finished ids are ignored."""
        stream = self.router.remove(request_id)
        if stream is None:
            return
        stream.put(
            protocol.EngineCoreOutput(
                request_id, [], protocol.FinishReason("abort", message="aborted by the frontend")
            )
        )
        record = self.registry.get(stream.engine_index)
        if record is not None and record.incarnation == stream.incarnation:
            # remembered: outputs the engine sent before it read this are strays, not to be aborted again
            record.note_aborted([request_id])
            await self._send(record.identity, protocol.AbortRequests([request_id]))

    # ---- receiving ----

    async def _receive_loop(self) -> None:
        assert self._sockets is not None
        while True:
            frames, fd = await self._sockets.receive_output()
            try:
                await self._handle_frames([frame.buffer for frame in frames], fd)
            except protocol.ProtocolError as e:
                self.metrics.count_protocol_error(e.kind)
                self._log.warning(e.kind, "dropped a bad frame from an engine: %s", e)
            except Exception:  # noqa: BLE001 - one bad message must never stop the frontend
                message = "error while handling an engine message; it was dropped"
                self._log.log(logging.ERROR, "internal", message, exc_info=True)

    async def _stray_loop(self) -> None:
        """Engines never send on the request socket: anything arriving there is counted and dropped."""
        assert self._sockets is not None
        while True:
            frames = await self._sockets.receive_stray()
            self.metrics.count_protocol_error("unexpected")
            peer = bytes(frames[0][:40]) if frames else b""
            self._log.warning(
                "unexpected",
                "dropped a message from %r on the request socket, where engines never send",
                peer,
            )

    async def _handle_frames(self, frames: list[memoryview], fd: int | None) -> None:
        if len(frames) != 1:
            raise protocol.ProtocolError("frames", f"expected one frame per message, got {len(frames)}")
        try:
            message = self._output_codec.decode(frames[0])
        except protocol.ProtocolError:
            await self._handshake.refuse_foreign(frames[0])
            raise
        if isinstance(message, protocol.EngineHello):
            await self._on_hello(message, fd)
        elif isinstance(message, protocol.EngineCoreOutputs):
            await self._on_outputs(message, fd)
        else:
            record = await self._sender(message, fd)
            if record is not None and not DrafterCommands.on_reply(record, message):
                self._log.info(
                    "unawaited",
                    "%s answered command %s, which no one awaits now",
                    record.describe(),
                    message.command_id,
                )

    async def _on_hello(self, hello: protocol.EngineHello, fd: int | None) -> None:
        tokenizer = await self._handshake.accept(hello, fd)
        if tokenizer is None:
            return
        index, incarnation = hello.engine_index, hello.incarnation
        record = self.registry.current(index, incarnation)
        if record is None:
            self._join(hello, tokenizer, fd)
            return
        if hello.seq <= record.last_seq:
            await self._departures.stale(record, hello.seq)
            return
        record.hello, record.tokenizer, record.last_seq = kept_hello(hello), tokenizer, hello.seq
        record.num_spec_tokens = hello.num_spec_tokens
        self._heard_from(record, hello.seq, hello.load, fd, after_hello=False)

    def _join(self, hello: protocol.EngineHello, tokenizer: Tokenizer, fd: int | None) -> None:
        """A new incarnation becomes its index's current one; the one it replaces ends as restarted."""
        index, incarnation = hello.engine_index, hello.incarnation
        record = EngineRecord(
            kept_hello(hello),
            tokenizer,
            time.monotonic(),
            hello.seq,
            hello.load,
            hello.num_spec_tokens,
            fd=fd,
        )
        previous = self.registry.install(record)
        exports = record.exports_metrics
        if exports:
            self.metrics.engine_joined(index, incarnation)
        kv = f"{hello.kv_num_blocks} KV blocks of {hello.kv_block_size} tokens"
        spec = f"{hello.num_spec_tokens} spec tokens" if hello.num_spec_tokens else "no speculation"
        spec += "" if exports else "; its metrics are exported by its first frontend"
        self._log.info(
            "joined", "%s joined: max_model_len %d, %s, %s", record.describe(), hello.max_model_len, kv, spec
        )
        if exports:
            self.metrics.set_engine_up(index, True)
            # (saved at once if the index is new here)
            self.metrics.observe_message(index, incarnation, hello.seq, record.model_name, hello.load)
        if previous is not None:
            self._departures.replaced(previous, record)

    async def _on_outputs(self, message: protocol.EngineCoreOutputs, fd: int | None) -> None:
        record = await self._sender(message, fd)
        if record is None:
            return
        strays = [output.request_id for output in message.outputs if not self.router.route(record, output)]
        if strays:
            await self._departures.strays(record, strays)

    async def _sender(
        self, message: protocol.EngineCoreOutputs | protocol.DrafterReply, fd: int | None
    ) -> EngineRecord | None:
        """The current record of a message's sender, with its load taken; None (dropped) if there is none."""
        index, incarnation = message.engine_index, message.incarnation
        record = self.registry.current(index, incarnation)
        if record is None:
            await self._handshake.unknown_sender(index, incarnation)
            return None
        if message.seq <= record.last_seq:
            await self._departures.stale(record, message.seq)
            return None
        record.last_seq = message.seq
        self._heard_from(record, message.seq, message.load, fd, after_hello=True)
        return record

    def _heard_from(
        self, record: EngineRecord, seq: int, load: protocol.LoadSnapshot, fd: int | None, after_hello: bool
    ) -> None:
        """Any message of a current incarnation: it is alive, and this is its load now."""
        record.last_seen = time.monotonic()
        record.load = load
        record.sent_since_snapshot = 0
        record.heard_after_hello |= after_hello
        if fd is not None:
            record.fd = fd
        if not record.up:
            record.up = True
            record.disconnected_at = None
            self._log.info("back", "%s is back", record.describe())
            if record.exports_metrics:
                self.metrics.set_engine_up(record.index, True)
        if record.exports_metrics:
            self.metrics.observe_message(
                record.index, record.incarnation, seq, record.model_name, record.load
            )

    # ---- sending ----

    async def _deliver(self, record: EngineRecord, stream: RequestStream, why_moved: str = "") -> None:
        """Send an assigned request; it ends with an error if that fails (unless it moved on meanwhile)."""
        assert stream.request is not None
        sent = await self._send(record.identity, stream.request, _SEND_PATIENCE_S)
        if not sent and self.router.on(record, stream.request_id) is stream:
            reason = f"{record.describe()} is not connected to the request socket"
            self.router.fail(stream, f"{why_moved}; then {reason}" if why_moved else reason)

    async def _send(self, identity: bytes, message: protocol.EngineInput, patience: float = 0.0) -> bool:
        """Send to one engine, retrying for ``patience`` seconds while it is unroutable; True once sent."""
        if self._sockets is None:
            return False
        error = await self._sockets.send(identity, self._input_codec.encode(message), patience)
        if error is not None:
            name = type(message).__name__
            self._log.warning("send", "could not send %s to %s: %s", name, identity.decode(), error)
        return error is None
