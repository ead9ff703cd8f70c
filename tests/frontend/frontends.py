"""The frontends the frontend tests run: an in-process frontend (:class:`Frontend`), the factories their
fixtures (``conftest.py``) hand out, and the session's real ``--fake-model`` engine with the hold on its ports."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from tests.e2e.processes import Cluster
from tests.frontend.engine_peer import EnginePeer


@dataclass
class Frontend:
    """A running frontend: HTTP base URL, the engine address, and its internals for white-box checks."""

    url: str
    engine_address: str
    client: EngineClient
    metrics: FrontendMetrics
    runner: web.AppRunner
    stopped: bool = False

    async def stop(self) -> None:
        """Stop serving and close the engine sockets (again: nothing)."""
        if not self.stopped:
            self.stopped = True
            await self.runner.cleanup()
            await self.client.close()


FrontendFactory = Callable[..., Awaitable[Frontend]]
PeerFactory = Callable[..., Awaitable[EnginePeer]]


FakeFrontendFactory = Callable[..., Awaitable[Frontend]]


class PortHold:
    """The engine port pair of the session's fake engine, bound (not listening) while no frontend of a test
    binds it: no other test's frontend can be given those ports and take the fake engine in as its own."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._sockets: list[socket.socket] = []
        self.hold()

    def hold(self) -> None:
        for port in (self.port, self.port + 1):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))  # bound, never listening: the engine's connects are refused
            self._sockets.append(s)

    def release(self) -> None:
        for s in self._sockets:
            s.close()
        self._sockets.clear()


@dataclass
class FakeEngine:
    """The session's ``--fake-model`` engine process and the hold on its frontend's ports."""

    cluster: Cluster
    ports: PortHold

    @property
    def address(self) -> str:
        return self.cluster.engine_address
