"""A connection is closed when its next request's head is not in within the keep-alive timeout: silent from the
start, idle after a response, or sending its head a line at a time; a response in progress is never cut.
Raw sockets against a real server on loopback, with a 0.5 s timeout (the server's default is vLLM's 5 s)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.frontend.engine_peer import PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory

KEEP_ALIVE_S = 0.5
_WAIT_S = 10.0  # the bound on a close or an answer: 20 times the timeout


@pytest.fixture
async def frontend(start_frontend: FrontendFactory) -> Frontend:
    return await start_frontend(keep_alive_s=KEEP_ALIVE_S)


@contextlib.asynccontextmanager
async def connection(frontend: Frontend) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    url = urlsplit(frontend.url)
    assert url.hostname is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        yield reader, writer
    finally:
        writer.close()


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """What the server sends until it closes the connection (b"" when it says nothing)."""
    return await asyncio.wait_for(reader.read(), _WAIT_S)


async def test_a_silent_connection_is_closed(frontend: Frontend) -> None:
    """A connection that never sends a byte is closed without an answer."""
    async with connection(frontend) as (reader, _):
        assert await closed_by_server(reader) == b""


async def test_a_head_sent_a_line_at_a_time_is_closed(frontend: Frontend) -> None:
    """A client that keeps sending header lines (one every 0.1 s) but never ends its head is closed all the
    same: bytes that arrive do not restart the timer, only a whole request head does."""
    async with connection(frontend) as (reader, writer):
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")

        async def trickle() -> None:
            for i in range(int(_WAIT_S / 0.1)):
                writer.write(f"X-Slow-{i}: a\r\n".encode())
                await writer.drain()
                await asyncio.sleep(0.1)

        sender = asyncio.create_task(trickle())
        try:
            assert await closed_by_server(reader) == b""
            assert not sender.done()  # it was still sending when the server closed
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)


async def test_an_idle_keep_alive_connection_is_closed(frontend: Frontend) -> None:
    """After a keep-alive response, a connection that sends no next request is closed."""
    async with connection(frontend) as (reader, writer):
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _WAIT_S)
        assert head.startswith(b"HTTP/1.1 200 ") and b"Connection: close" not in head
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        assert await closed_by_server(reader) == b""


async def test_a_stream_longer_than_the_timeout_is_not_cut(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """A streamed completion of 12 tokens 0.2 s apart (over 2 s, four times the timeout) arrives whole,
    and so does a non-streamed one that waits as long."""
    await start_peer(frontend, PeerConfig(token_delay_s=0.2))
    body = {"prompt": "hello world", "max_tokens": 12, "ignore_eos": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_WAIT_S * 2)) as session:
        async with session.post(f"{frontend.url}/v1/completions", json={**body, "stream": True}) as r:
            assert r.status == 200
            events = [block.removeprefix("data: ") for block in (await r.text()).split("\n\n") if block]
        async with session.post(f"{frontend.url}/v1/completions", json=body) as r:
            assert r.status == 200
            complete = await r.json()
    assert events[-1] == "[DONE]"
    finishes = [json.loads(event)["choices"][0]["finish_reason"] for event in events[:-1]]
    assert finishes[-1] == "length" and complete["usage"]["completion_tokens"] == 12
