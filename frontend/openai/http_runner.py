"""Where an app serves: its aiohttp runner, on a host and port or on a listening socket it is given."""

from __future__ import annotations

import socket

from aiohttp import web

from openinfer.frontend.openai.http_logs import QuietAccessLogger, server_logger


async def serve(
    app: web.Application,
    host: str,
    port: int,
    keep_alive_s: float = 5.0,
    listener: socket.socket | None = None,
) -> web.AppRunner:
    """Serve ``app`` on ``host``:``port`` (port 0: any free port, see ``runner.addresses``), or on the
    ``listener`` given, already bound and listening (``openinfer-serve``'s, shared by its api servers); stop
    with ``runner.cleanup()``.

    Handlers are cancelled when their client disconnects, which aborts the request on its engine. A connection
    is closed when the head of its next request is not in within ``keep_alive_s`` seconds of its start or of
    its last response (uvicorn's and so vLLM's keep-alive is 5 s): aiohttp's keep-alive timer runs from the
    connection's start and closes it whenever no request head has arrived by then, however much of one has,
    so one timer is the idle timeout and the header-read timeout. A response in progress is never cut.
    """
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=5.0,
        access_log_class=QuietAccessLogger,
        keepalive_timeout=keep_alive_s,
        logger=server_logger(),
        # A body left unread (refused by its Content-Length: 413) is not drained, the connection is closed:
        # draining an attacker's tens of MB cost /health 100-150 ms; clients still read the 413 (curl, httpx).
        lingering_time=0.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port) if listener is None else web.SockSite(runner, listener)
    await site.start()
    return runner
