"""The frontend's two bound engine sockets, their monitors, and CurveZMQ when keys are given.

Requests leave through a ROUTER, outputs arrive on a PULL (:mod:`openinfer.frontend.addresses`). Each
socket has a monitor: the PULL's ``DISCONNECTED`` events name the file descriptor of the connection that
closed, and every received output names the descriptor it came over (``SRCFD``), so the engine client can
tell which engine's connection closed (a killed process's connections close at once). Failed handshakes
(a peer without an admitted CURVE key, or one that does not speak ZMTP) are reported too.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import AsyncIterator
from typing import Literal, NamedTuple

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from openinfer.frontend.addresses import EngineAddresses
from openinfer.frontend.engines.server_keys import CurveServerKeys

logger = logging.getLogger(__name__)

_HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_MONITORED = zmq.EVENT_DISCONNECTED | _HANDSHAKE_FAILURES


# The largest message either socket takes (libzmq drops the connection of a peer that sends a bigger one). The
# largest real message is a hello, which carries the model's tokenizer.json: 64 MiB holds every one we know of
# (Qwen3's is 11 MB; the biggest published are a few tens of MB) with its tokenizer_config.json. Any peer
# can send a frame this big, so it also bounds what a bad frame can cost to read.
MAX_MESSAGE_BYTES = 64 * 2**20

# The longest a socket's backlog is read before the event loop runs its other tasks (HTTP handlers, /health).
_MAX_RECEIVE_S = 0.002

# The two sockets the frontend binds: the ROUTER requests leave by, the PULL outputs arrive on.
SocketName = Literal["requests", "outputs"]


class SocketEvent(NamedTuple):
    """A monitor event: which socket, what happened, and the event's value."""

    socket: SocketName
    disconnected: bool  # True: a connection closed (value: its fd); False: a handshake failed (value: errno)
    value: int


class _Turns:
    """Takes turns with the event loop while a socket's backlog is read: a message already queued is received
    without a pass of the loop, so a peer flooding a socket would otherwise hold every other task back."""

    def __init__(self) -> None:
        self._since = time.monotonic()  # of the last pass of the loop made here

    async def take(self) -> None:
        """A pass of the loop if the last one made here is more than ``_MAX_RECEIVE_S`` ago: through a
        backlog every 2 ms, which costs far less than one per message."""
        if time.monotonic() - self._since > _MAX_RECEIVE_S:
            await asyncio.sleep(0)
            self._since = time.monotonic()


async def _receive(socket: zmq.asyncio.Socket, copy: bool = True) -> list:
    """The next message on ``socket``. libzmq's events can say a CURVE socket is readable before its message
    can be read (pyzmq then raises ``zmq.Again`` from the awaited receive: seen with a multi-MB hello), so
    that is waited out here rather than ending the caller's receive loop."""
    while True:
        try:
            return await socket.recv_multipart(copy=copy)
        except zmq.Again:
            continue  # the next receive tries once, then waits for the socket's next event


class EngineSockets:
    """ROUTER + PULL bound for engines; with ``curve`` both are CURVE servers behind a ZAP authenticator."""

    def __init__(self, addresses: EngineAddresses, curve: CurveServerKeys | None = None) -> None:
        self.addresses = addresses
        self._curve = curve
        self._context = zmq.asyncio.Context()
        self._auth: AsyncioAuthenticator | None = None
        self.router = self._context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unroutable send raises instead of vanishing
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting engine takes its identity back
        self.router.setsockopt(zmq.SNDHWM, 0)  # requests are small; never drop or block on a slow engine
        self.router.setsockopt(zmq.RCVHWM, 16)  # engines never send here: whatever comes is dropped
        self.pull = self._context.socket(zmq.PULL)
        for socket in (self.router, self.pull):
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._turns: dict[SocketName, _Turns] = {"requests": _Turns(), "outputs": _Turns()}
        self._monitors: list[tuple[SocketName, zmq.asyncio.Socket]] = [
            ("requests", self.router.get_monitor_socket(_MONITORED)),
            ("outputs", self.pull.get_monitor_socket(_MONITORED)),
        ]

    def bind(self) -> None:
        """Bind both sockets (as CURVE servers when keys were given); ``zmq.ZMQError`` if a port is taken."""
        try:
            if self._curve is not None:
                self._auth = AsyncioAuthenticator(self._context)
                self._auth.start()
                self._auth.configure_curve(domain="*", location=str(self._curve.engines_dir))
                for socket in (self.router, self.pull):
                    socket.curve_secretkey = self._curve.secret
                    socket.curve_publickey = self._curve.public
                    socket.curve_server = True
            self.router.bind(self.addresses.requests)
            self.pull.bind(self.addresses.outputs)
        except zmq.ZMQError:
            self.close()
            raise

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self._context.destroy(linger=0)

    async def receive_output(self) -> tuple[list[zmq.Frame], int | None]:
        """The next message on the PULL, and the fd of the connection it came over (None if unknown)."""
        await self._turns["outputs"].take()
        frames = await _receive(self.pull, copy=False)
        try:
            fd = frames[0].get(zmq.SRCFD)
        except zmq.ZMQError:
            fd = None
        return frames, fd if isinstance(fd, int) and fd >= 0 else None

    async def receive_stray(self) -> list[bytes]:
        """The next message on the ROUTER (engines never send there)."""
        await self._turns["requests"].take()
        return await _receive(self.router)

    async def events(self) -> AsyncIterator[SocketEvent]:
        """Disconnections and failed handshakes on either socket, as they come."""
        queue: asyncio.Queue[SocketEvent] = asyncio.Queue()

        async def watch(name: SocketName, monitor: zmq.asyncio.Socket) -> None:
            turns = _Turns()  # strangers can connect and fail as fast as they like
            while True:
                await turns.take()
                frames = await _receive(monitor)
                if len(frames) != 2 or len(frames[0]) != 6:
                    continue
                event, value = struct.unpack("=Hi", frames[0])
                if event == zmq.EVENT_MONITOR_STOPPED:
                    return
                queue.put_nowait(SocketEvent(name, event == zmq.EVENT_DISCONNECTED, value))

        watchers = [asyncio.create_task(watch(name, monitor)) for name, monitor in self._monitors]
        try:
            while True:
                yield await queue.get()
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    async def send(self, identity: bytes, payload: bytes, patience: float = 0.0) -> zmq.ZMQError | None:
        """Send to one engine, retrying for ``patience`` seconds while it is unroutable; the last error if
        it never could (EHOSTUNREACH: its DEALER is not connected), None once sent."""
        deadline = time.monotonic() + patience
        while True:
            try:
                await self.router.send_multipart([identity, payload], flags=zmq.DONTWAIT)
                return None
            except zmq.ZMQError as e:
                if time.monotonic() >= deadline:
                    return e
            await asyncio.sleep(0.02)
