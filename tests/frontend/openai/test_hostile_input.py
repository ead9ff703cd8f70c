"""4xx, never 500, for every input, over a real HTTP server: bodies nested past any limit, header bytes
that are not ASCII (or not UTF-8), and streaming clients that leave mid-request (quietly, their requests
released)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Any

import aiohttp
import pytest

from openinfer.frontend.openai.body.decode import MAX_NESTING
from openinfer.frontend.openai.cors import CorsPolicy
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.waits import wait_until

KEY = "sesame"
CHAT = '{"messages": [{"role": "user", "content": "hi"}], '  # a chat body's start


async def post(frontend: Frontend, path: str, body: bytes) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{frontend.url}{path}", data=body, headers=headers) as response:
            return response.status, await response.json()


async def raw_exchange(frontend: Frontend, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as bytes on a new connection; (status, body) of the answer."""
    host, port = frontend.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        return int(head.split(b" ", 2)[1]), await asyncio.wait_for(reader.readexactly(length), timeout=5)
    finally:
        writer.close()


def completion_request(header: bytes, body: bytes = b'{"prompt": "hi", "max_tokens": 2}') -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + header
        + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        + body
    )


@pytest.fixture
async def frontend(start_frontend: FrontendFactory) -> Frontend:
    """A frontend with an API key (its admin routes on), the loopback Host rule and CORS for any origin
    with credentials (which echoes a request's Origin back)."""
    return await start_frontend(
        api_key=KEY, loopback_host="127.0.0.1", cors=CorsPolicy(("*",), allow_credentials=True)
    )


# ---- nesting ----


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/admin/engines/0/drafter"])
async def test_sixty_thousand_brackets_are_a_400(frontend: Frontend, peer: EnginePeer, path: str) -> None:
    """'[' * 60000 as a body (a RecursionError, a 500, before; within the admin API's 64 KiB bound): a 400
    saying it nests too deeply."""
    status, body = await post(frontend, path, b"[" * 60_000)
    assert status == 400 and "nests arrays and objects more than 128 levels" in body["error"]["message"]


def nested(depth: int) -> str:
    """A JSON value of ``depth`` arrays and objects within one another, alternating, an object innermost."""
    text = '{"a": 1}'
    for level in range(depth - 1):
        text = f"[2, {text}]" if level % 2 else f'{{"b": {text}, "c": []}}'
    return text


# (endpoint, field, a body whose field holds ``value``, how many levels the body adds around ``value``)
NESTING_PLACES = [
    ("/v1/completions", "response_format", '{"prompt": "hi", "response_format": %s}', 1),
    ("/v1/completions", "structured_outputs", '{"prompt": "hi", "structured_outputs": {"json": %s}}', 2),
    ("/v1/completions", "best_of", '{"prompt": "hi", "best_of": %s}', 1),
    ("/v1/completions", "suffix", '{"prompt": "hi", "suffix": %s}', 1),
    ("/v1/chat/completions", "messages", '{"messages": [{"role": "user", "content": "hi", "x": %s}]}', 3),
    ("/v1/chat/completions", "chat_template_kwargs", CHAT + '"chat_template_kwargs": {"a": %s}}', 2),
    ("/v1/chat/completions", "tools", CHAT + '"tools": %s}', 1),
    ("/v1/chat/completions", "tool_choice", CHAT + '"tool_choice": %s}', 1),
    ("/v1/chat/completions", "function_call", CHAT + '"function_call": %s}', 1),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "field", "template", "around"), NESTING_PLACES, ids=[p[1] for p in NESTING_PLACES]
)
async def test_nesting_past_the_limit_in_any_field_is_a_400_naming_it(
    frontend: Frontend, peer: EnginePeer, path: str, field: str, template: str, around: int
) -> None:
    """A field nested to exactly MAX_NESTING levels (the body's object counted) passes the nesting rule
    (whatever else its value earns); one level more is a 400 naming the field, and never reaches the engine."""
    at_limit = (template % nested(MAX_NESTING - around)).encode()
    status, body = await post(frontend, path, at_limit)
    assert "nests" not in (body.get("error") or {}).get("message", ""), body
    status, body = await post(frontend, path, (template % nested(MAX_NESTING - around + 1)).encode())
    assert (status, body["error"]["param"]) == (400, field)
    assert f"`{field}` nests arrays and objects more than {MAX_NESTING} levels" in body["error"]["message"]
    assert len(frontend.client.router) == 0


async def test_a_json_schema_given_as_a_string_is_bounded_alike(frontend: Frontend, peer: EnginePeer) -> None:
    """structured_outputs.json as a string holding JSON: nested past the limit (or past Python's recursion
    limit) it is a 400 naming structured_outputs."""
    for depth in (MAX_NESTING + 1, 5000):
        request = {"prompt": "hi", "structured_outputs": {"json": nested(depth)}}
        status, body = await post(frontend, "/v1/completions", json.dumps(request).encode())
        assert (status, body["error"]["param"]) == (400, "structured_outputs")


# ---- header bytes ----


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (b"Authorization: Bearer \xff\xfe", 401),  # not UTF-8 (a 500 before authentication, before)
        (b"Authorization: \xc3\x28", 401),
        (b"Authorization: Bearer s\xc3\xa9same", 401),  # UTF-8, not the key
        (b"X-Request-Id: \xff", 400),
        (b"X-Request-Id: caf\xc3\xa9", 400),
        (b"Host: \xff", 400),  # replaces the Host of completion_request: the loopback rule refuses it
        (b"Origin: \xff\xfe", 200),  # not echoed back, even with any origin and credentials
        (b"Origin: http://caf\xc3\xa9.example\r\nCookie: a=b", 200),
        (b"Content-Type: application/\xff", 400),
        (b"X-Anything: \xff\x80\xc0", 200),
    ],
)
async def test_header_bytes_that_are_not_ascii_get_4xx_or_are_served(
    frontend: Frontend, peer: EnginePeer, header: bytes, status: int
) -> None:
    """Header values of any byte above 0x7f reach the middlewares decoded with surrogates; each is answered
    as its header deserves, in OpenAI's shape when refused, never with a 500."""
    auth = b"" if header.startswith(b"Authorization") else b"Authorization: Bearer sesame\r\n"
    request = completion_request(auth + header)
    if header.startswith((b"Host", b"Content-Type")):  # the header replaces the request's own
        name = header.split(b":", 1)[0]
        request = request.replace(b"\r\n%s: " % name, b"\r\nX-Replaced-%s: " % name, 1)
    got, body = await raw_exchange(frontend, request)
    assert got == status, body
    if status >= 400:
        assert "error" in json.loads(body)


@pytest.mark.parametrize(
    "header",
    [b"Authorization: Bearer sesame\x01", b"Host: b", b"Content-Length: -1"],
    ids=["control-byte", "second-host", "negative-length"],
)
async def test_requests_that_do_not_parse_are_aiohttps_400_and_one_debug_line(
    frontend: Frontend, peer: EnginePeer, header: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """A request aiohttp's parser refuses never reaches the app: a 400, and in the log one DEBUG line saying
    why, no ERROR traceback (any client could send thousands)."""
    caplog.set_level(logging.DEBUG)
    status, _ = await raw_exchange(frontend, completion_request(header))
    assert status == 400 and peer.requests == {}
    unparsed = [r for r in caplog.records if "(answered 400)" in r.getMessage()]
    assert len(unparsed) == 1 and unparsed[0].levelno == logging.DEBUG and unparsed[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# ---- clients that leave mid-request ----


async def test_streaming_clients_that_leave_mid_request_are_quiet_and_released(
    start_frontend: FrontendFactory, start_peer: PeerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Streaming clients that close their connection as soon as their request reached the engine (before its
    first token): nothing logged as a warning or error, every request aborted on the engine, and the router
    empty. (Closing sooner races the server's reading of the request: it may then never reach the engine.)"""
    frontend = await start_frontend()
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05))
    caplog.set_level(logging.DEBUG)
    host, port = frontend.url.removeprefix("http://").split(":")
    body = b'{"prompt": "hello world", "max_tokens": 40, "stream": true}'
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    for sent in range(1, 21):
        with socket.create_connection((host, int(port)), timeout=5) as client:
            client.sendall(request)
            await wait_until(lambda sent=sent: len(peer.requests) == sent)  # it reached the engine: now leave
    await wait_until(lambda: len(frontend.client.router) == 0)
    await wait_until(lambda: set(peer.aborted) == set(peer.requests))
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [], [r.getMessage() for r in loud]
