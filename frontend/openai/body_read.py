"""Reading a request body within a size bound and a deadline.

aiohttp's own ``request.read()`` buffers a body up to the app's ``client_max_size`` before anyone can look at
it, and waits for it as long as the client likes: a client that sends its headers and then trickles its body,
or never ends a chunked one, would hold its connection (and up to 64 MiB) for ever. Here a body is read a
chunk at a time and refused as soon as it passes its bound (413, by its Content-Length before a byte is read
when it has one), and a body not all in within the deadline is a 408. Neither uvicorn nor so vLLM bounds the
time a body takes (uvicorn's proposed ``--timeout-request-complete``, 60 s, was never built); 408 is HTTP's
status for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from openinfer.frontend.openai.errors import ApiError

_CHUNK_BYTES = 1 << 20  # aiohttp buffers up to twice this before it stops reading the socket


async def read_body(
    request: web.BaseRequest,
    max_bytes: int,
    timeout: float,
    too_large: Callable[[int | None], ApiError],
) -> bytes:
    """The request's body, of at most ``max_bytes``, in within ``timeout`` seconds of the call.

    ``too_large(length)`` is the error for a larger body: ``length`` is its Content-Length, refused before
    anything is read, or None for a body without one, refused once ``max_bytes`` are passed (the rest is never
    read: the connection closes after the answer). Past the deadline, 408 (``request_timeout``).
    """
    length = request.content_length
    if length is not None and length > max_bytes:
        raise too_large(length)
    content = request.content
    content.set_read_chunk_size(min(max_bytes, _CHUNK_BYTES))
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            while chunk := await content.readany():
                size += len(chunk)
                if size > max_bytes:
                    raise too_large(None)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body was not all received within {timeout:g} s of its headers ({size} bytes "
            "came); send it at once, or raise the server's --http-timeout-body",
            code="request_timeout",
        ) from None
    return b"".join(chunks)
