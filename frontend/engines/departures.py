"""Engine incarnations that stop serving, and what becomes of the requests they held.

An incarnation stops serving when it goes down (silent past the engine timeout, or its output connection
closed and it was not heard from again: :mod:`~openinfer.frontend.engines.liveness`), when a new incarnation
of its index joins (it restarted), or when it is retired because two processes send as it (its seqs clash).
Its requests that streamed nothing yet move to another live engine of the model, at most ``MAX_SENDS``
sends in all; the others end with an error saying why. A record never heard from after its hello is
forgotten once it is down, with its series (forged hellos, then silence, leave nothing behind); the
counting state of its index is kept, bounded, so that a real engine whose first step outlasted the timeout
continues exactly when it comes back (:meth:`FrontendMetrics.forget_engine
<openinfer.frontend.metrics.frontend_metrics.FrontendMetrics.forget_engine>`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from openinfer import protocol
from openinfer.frontend.engines.drafter_commands import DrafterCommands
from openinfer.frontend.engines.handshake import Handshake, Send
from openinfer.frontend.engines.registry import STALE_GRACE_S, EngineRecord, EngineRegistry, Retirement
from openinfer.frontend.engines.request_stream import RequestStream
from openinfer.frontend.engines.router import Router
from openinfer.frontend.log_limit import LogRateLimiter
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics

logger = logging.getLogger(__name__)

# A request that no engine streamed anything for yet moves to another engine when its engine stops serving,
# as long as it was sent fewer times than this in all.
MAX_SENDS = 3

# Sends a request assigned to an engine, ending it with an error if it could not be sent; the last argument
# says why it moved (for that error).
Deliver = Callable[[EngineRecord, RequestStream, str], Awaitable[None]]


class Departures:
    """Takes engine incarnations out of service and moves or ends their requests.

    Every line here is one a peer can provoke, so all are rate-limited by kind. Re-sends run as tasks of
    their own; :meth:`close` cancels those still running.
    """

    def __init__(
        self,
        registry: EngineRegistry,
        router: Router,
        metrics: FrontendMetrics,
        handshake: Handshake,
        send: Send,
        deliver: Deliver,
    ) -> None:
        self._registry = registry
        self._router = router
        self._metrics = metrics
        self._handshake = handshake
        self._send = send
        self._deliver = deliver
        self._resends: set[asyncio.Task[None]] = set()
        self._log = LogRateLimiter(logger)

    async def close(self) -> None:
        """Cancel the re-sends still running (each ends its request: the frontend is going)."""
        for task in self._resends:
            task.cancel()
        await asyncio.gather(*self._resends, return_exceptions=True)

    async def mark_down(self, record: EngineRecord, why: str, connected: bool) -> None:
        """Down, its requests moved or ended; a still ``connected`` one is told to drop them (if it comes
        back, say from SIGSTOP, it must not go on with them; a disconnected one is aborted on its outputs).
        One never heard from after its hello is then forgotten, if nothing of it was counted."""
        self._log.warning("down", "%s is down: %s", record.describe(), why)
        self._take_down(record)
        in_flight = self._router.on_engine(record)
        if in_flight and connected:
            record.note_aborted(list(in_flight))
            await self._send(record.identity, protocol.AbortRequests(list(in_flight)))
        self.end_requests(record, f"{record.describe()} stopped responding: {why}")
        # Drafter commands keep waiting: loading a drafter can stall an engine; they time out on their own.
        if not (record.heard_after_hello or record.up) and self._registry.get(record.index) is record:
            self._forget(record)  # (unless it came back, or was replaced, while we sent)

    def replaced(self, previous: EngineRecord, record: EngineRecord) -> None:
        """``record``, a new incarnation of ``previous``'s index, joined: the previous one restarted."""
        self._log.warning(
            "restarted", "%s restarted as incarnation %016x", previous.describe(), record.incarnation
        )
        if previous.model_name != record.model_name:
            self._metrics.forget_load(previous.index, previous.model_name)
        DrafterCommands.end(previous, f"{previous.describe()} restarted before it answered")
        self.end_requests(previous, f"{previous.describe()} restarted")

    async def stale(self, record: EngineRecord, seq: int) -> None:
        """A message of a current incarnation whose seq did not go up: dropped and counted (kind "seq"). A
        closed connection's leftovers can do that for a moment after the engine reconnected; if such
        messages go on for ``STALE_GRACE_S``, two processes send as the incarnation (the engine, and a
        stranger that learnt its incarnation and sent a seq ahead of it). Which is which cannot be told, so
        the incarnation ends: its requests end with an error, it is retired (what it sends next is kind
        "refused") and told with ``HelloRefused``. A real engine then exits 3, and openinfer-serve starts it
        again: a new incarnation, taken at once. An engine's own seqs always go up, across frontend restarts
        too (a restarted frontend takes the seq of the hello it asked for).

        The connection a message came over does not tell a leftover from a second sender: a leftover's
        connection may be closed before the frontend reads its close, and a stranger's is open, so both look
        alike until the close is read; hence the grace."""
        self._metrics.count_protocol_error("seq")
        if record.stale_for(time.monotonic()) < STALE_GRACE_S:
            self._log.warning(
                "seq",
                "dropped a message of %s: seq %d after seq %d (a closed connection's leftover, or a second "
                "process sending as this incarnation: if they go on, it is retired)",
                record.describe(),
                seq,
                record.last_seq,
            )
            return
        why = (
            f"{record.describe()} keeps sending seqs below {record.last_seq} (seq {seq} now): two processes "
            "send as this incarnation, so it is retired; restart the engine (openinfer-serve does so by itself)"
        )
        self._log.warning("retired", "%s", why)
        self._take_down(record)
        await self._handshake.disown(record.index, record.incarnation, why, Retirement.CLASHED)
        DrafterCommands.end(record, why)
        self.end_requests(record, why)

    def end_requests(self, record: EngineRecord, reason: str) -> None:
        """Move its requests that got no output yet to another engine; end the others with an error."""
        for stream in self._router.on_engine(record).values():
            self._router.remove(stream.request_id)
            target = None
            if not stream.started and stream.num_sends < MAX_SENDS:
                target = self._router.pick(stream.model_name)
            if target is None:
                stream.fail(reason)
                continue
            self._log.info(
                "moved",
                "request %s moves from engine %d to engine %d",
                stream.request_id,
                record.index,
                target.index,
            )
            self._router.assign(target, stream)
            task = asyncio.create_task(self._resend(target, stream, reason))
            self._resends.add(task)
            task.add_done_callback(self._resends.discard)

    async def _resend(self, target: EngineRecord, stream: RequestStream, why_moved: str) -> None:
        """Deliver a moved request. Whatever goes wrong (a bug, or :meth:`close` cancelling it), the request
        leaves the router with an error rather than waiting there for an engine that never got it; nothing
        is left for the event loop to report as never retrieved."""
        try:
            await self._deliver(target, stream, why_moved)
        except BaseException as e:
            if self._router.on(target, stream.request_id) is stream:  # (unless it moved on meanwhile)
                self._router.fail(stream, f"{why_moved}; then it could not be sent to {target.describe()}")
            if not isinstance(e, Exception):
                raise  # cancelled
            self._log.log(
                logging.ERROR,
                "internal",
                "could not re-send request %s to %s",
                stream.request_id,
                target.describe(),
                exc_info=True,
            )

    def _take_down(self, record: EngineRecord) -> None:
        """Mark a record down: no requests go to it, its load series are dropped."""
        if record.exports_metrics:
            self._metrics.set_engine_up(record.index, False)
        record.up = False
        record.disconnected_at = None
        self._metrics.forget_load(record.index, record.model_name)

    def _forget(self, record: EngineRecord) -> None:
        """Forget the record of an index never heard from after its hello (forged hellos, then silence), with
        its series, unless something of it was counted (exported counters never go down). Heard from again,
        it is asked for its hello and joins anew, its counts going on from where they were."""
        if self._metrics.forget_engine(record.index):
            self._registry.forget(record.index)
            self._log.info("forgotten", "%s: never heard from after its hello; forgotten", record.describe())

    async def strays(self, record: EngineRecord, request_ids: list[str]) -> None:
        """An engine sends outputs for requests that ended here (it was paused past the timeout, or an
        earlier frontend sent them): abort them there, once each."""
        new = record.note_aborted(request_ids)
        if not new:
            return
        self._log.info(
            "strays",
            "%s sent outputs for %d requests that ended here; aborting them",
            record.describe(),
            len(new),
        )
        await self._send(record.identity, protocol.AbortRequests(new))
