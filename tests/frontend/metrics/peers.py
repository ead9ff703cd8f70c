"""Api servers in one process for the peers-folder tests: a frontend's metrics exporting one engine, a view
in the file a peer leaves, a fake peer on a Unix socket, and this process acting as another user."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import msgspec
import pytest

from openinfer.frontend.metrics.api_servers import ApiServers, ApiServerView
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.protocol import LoadSnapshot, SpecDecodeCounters

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")


def exporting(engine: int) -> FrontendMetrics:
    """A frontend's metrics as the metrics frontend of ``engine`` (model m): up, after 3 drafts."""
    metrics = FrontendMetrics()
    counters = SpecDecodeCounters.zero(2)
    metrics.set_engine_up(engine, True)
    metrics.observe_message(engine, 7, 1, "m", LoadSnapshot(1, 4, 1, 0, counters.copy()))  # first sight
    for _ in range(3):
        counters.observe_draft(2, 1)
    metrics.observe_message(engine, 7, 2, "m", LoadSnapshot(1, 4, 1, 0, counters))
    return metrics


def api_server_0(folder: Path) -> ApiServers:
    """Api server 0 of 2 in ``folder``, the metrics frontend of engine 0."""
    return ApiServers(exporting(0), folder, 0, 2)


def view(exposition: str) -> bytes:
    return msgspec.msgpack.encode(ApiServerView(exposition, {}))


def engine_1_view() -> bytes:
    """Api server 1's view, as it makes it: engine 1's series."""
    return view(exporting(1).render().decode())


def leave_view_file(folder: Path, data: bytes) -> Path:
    """``data`` as api server 1's last view file (it does not answer: no socket)."""
    path = folder / "api-server-1.view"
    path.write_bytes(data)
    return path


@asynccontextmanager
async def fake_peer(path: Path, body: bytes, listener_uid: int | None = None) -> AsyncIterator[None]:
    """A Unix socket at ``path`` answering every request with ``body`` (HTTP 200), listened on by this
    process as ``listener_uid`` when given (its peer credentials are those of the last ``listen``)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\nContent-Length: %d\r\n" % len(body)
        writer.write(head + b"Connection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(answer, str(path))
    if listener_uid is not None:
        with socket.fromfd(server.sockets[0].fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as same:
            with effective_uid(listener_uid):
                same.listen()
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


@contextmanager
def effective_uid(uid: int) -> Iterator[None]:
    """This (root) process acts as ``uid`` inside the block: what it connects or listens on carries that
    uid as its peer credentials, and the files it reaches are checked for that uid."""
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
