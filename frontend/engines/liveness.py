"""When an engine is dead to the frontend (docs/design.md, liveness), decided from what the frontend saw.

Two ways: it sent nothing for ``engine_timeout`` seconds (a hung or paused engine, a partitioned host), or
the connection its outputs came over closed and it was not heard from again soon after (a killed process:
its TCP connections close at once). File descriptors are reused, so a closed one only puts the engines last
heard on it on probation: a live engine reconnects within 0.1 s and sends at least every 0.5 s, a dead one
is silent. Messages read in the first part of the window may have been sent before the death (the frontend
can lag behind its socket), so only one in the last part proves the engine alive.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from openinfer.frontend.engines.registry import EngineRecord, EngineRegistry
from openinfer.frontend.engines.sockets import EngineSockets, SocketEvent
from openinfer.frontend.log_limit import LogRateLimiter
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics

logger = logging.getLogger(__name__)

DISCONNECT_PROBE_S = 1.0  # the probation after a closed connection: death -> client error in ~1 s
DISCONNECT_PROBE_QUIET_S = 0.3  # messages read this soon after the close prove nothing
TICK_S = 0.1  # how often the verdicts are taken


class Liveness:
    """The verdicts over engine records; the records carry ``last_seen``, ``fd`` and ``disconnected_at``."""

    def __init__(self, engine_timeout: float) -> None:
        if engine_timeout <= 0:
            raise ValueError(f"engine_timeout must be positive, got {engine_timeout}")
        self.engine_timeout = engine_timeout

    def connection_closed(self, records: list[EngineRecord], fd: int, now: float) -> list[EngineRecord]:
        """The output connection with descriptor ``fd`` closed: the live engines last heard on it are on
        probation from ``now``; returns them."""
        suspects = [record for record in records if record.up and record.fd == fd]
        for record in suspects:
            record.fd = None
            record.disconnected_at = now
        return suspects

    def holds_index(self, record: EngineRecord, now: float) -> bool:
        """Whether ``record`` keeps its index from a new incarnation (docs/design.md: a stranger never evicts a
        live engine): it is up, heard within the timeout, and its connection is open, or it was heard from
        late enough after the close to prove it reconnected. A restarted engine's predecessor fails this."""
        if not record.up or now - record.last_seen > self.engine_timeout:
            return False
        closed = record.disconnected_at
        return closed is None or record.last_seen - closed >= DISCONNECT_PROBE_QUIET_S

    def verdict(self, record: EngineRecord, now: float) -> tuple[str, bool] | None:
        """Why a live engine is dead now, and whether it may still be connected (then it can be told to
        drop its requests); None while it is alive."""
        if now - record.last_seen > self.engine_timeout:
            return f"it sent nothing for {self.engine_timeout:g} s", True
        if record.disconnected_at is None or now - record.disconnected_at < DISCONNECT_PROBE_S:
            return None
        if record.last_seen - record.disconnected_at >= DISCONNECT_PROBE_QUIET_S:
            record.disconnected_at = None  # it reconnected: alive
            return None
        why = (
            f"its connection closed and it was not heard from in {DISCONNECT_PROBE_S:g} s (the process died?)"
        )
        return why, False


# What the watch does with a dead engine: (record, why, whether it may still be connected).
MarkDown = Callable[[EngineRecord, str, bool], Awaitable[None]]


class LivenessWatch:
    """The two loops that find dead engines: the sockets' monitor events and the verdicts every tick."""

    def __init__(
        self,
        registry: EngineRegistry,
        liveness: Liveness,
        metrics: FrontendMetrics,
        mark_down: MarkDown,
    ) -> None:
        self._registry = registry
        self._liveness = liveness
        self._metrics = metrics
        self._mark_down = mark_down
        self._log = LogRateLimiter(logger)

    async def watch_events(self, sockets: EngineSockets) -> None:
        """Follow the sockets' monitor events until cancelled."""
        async for event in sockets.events():
            self.on_socket_event(event)

    def on_socket_event(self, event: SocketEvent) -> None:
        if not event.disconnected:
            self._metrics.count_protocol_error("handshake")
            self._log.warning(
                "handshake",
                "a peer failed the handshake on the %s socket (errno %d): a wrong or missing CurveZMQ key, or "
                "not a ZeroMQ peer",
                event.socket,
                event.value,
            )
            return
        if event.socket != "outputs":
            return  # requests connections say nothing of who they were; the outputs one is enough
        for record in self._liveness.connection_closed(self._registry.live(), event.value, time.monotonic()):
            self._log.info("disconnected", "%s: its output connection closed", record.describe())

    async def run(self) -> None:
        """Take the verdicts every tick until cancelled; a dead engine goes to ``mark_down``."""
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            for record in self._registry.live():
                verdict = self._liveness.verdict(record, now)
                if verdict is not None:
                    await self._mark_down(record, *verdict)
