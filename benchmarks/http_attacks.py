"""Issue 25's attacks through the HTTP API: integers past 2^64, cross-origin requests, big bodies, slow
schemas, slowloris, bodies the error path must survive."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from openinfer.benchmarks.attack_target import Target, post, tally

EVIL = "http://evil.example"


async def big_integers(target: Target) -> str:
    """Each integer field at 2^64 once, then ``top_k`` at 2^64 (it overflowed the encoder after admission
    and leaked its router entry) up to 300 times, one after the other, then a normal request: a 503 says the
    leaks filled the engine's queue (--max-queued-per-engine, 256 by default)."""
    fields = ["top_k", "seed", "max_tokens", "min_tokens", "logprobs", "n"]
    failed = [name for name in fields if await post(target, target.body(**{name: 2**64})) >= 500]
    statuses: list[int] = []
    deadline = time.monotonic() + target.seconds
    while time.monotonic() < deadline and len(statuses) < 300:
        statuses.append(await post(target, target.body(top_k=2**64)))
    normal = await post(target, target.body())
    flood = f"top_k=2^64 ×{len(statuses)}: {tally(statuses)}"
    return f"5xx for: {', '.join(failed) or 'none'}; {flood}; then a normal request: {normal}"


async def cross_origin(target: Target) -> str:
    """What a page on another origin can send without a CORS preflight (and without the API key): a JSON
    body as text/plain, form or multipart; a request for ``Host: evil.example`` (DNS rebinding); a preflight."""
    body = json.dumps(target.body()).encode()
    cases = [
        ("text/plain", "POST", {"Content-Type": "text/plain", "Origin": EVIL}),
        ("form", "POST", {"Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL}),
        ("multipart", "POST", {"Content-Type": "multipart/form-data; boundary=x", "Origin": EVIL}),
        ("Host evil", "POST", {"Content-Type": "application/json", "Host": "evil.example"}),
        ("preflight", "OPTIONS", {"Origin": EVIL, "Access-Control-Request-Method": "POST"}),
    ]
    answers, allowed = [], set()
    async with aiohttp.ClientSession() as page:
        for label, method, headers in cases:
            async with page.request(method, f"{target.url}/v1/completions", data=body, headers=headers) as r:
                answers.append(f"{label} {r.status}")
                allowed.add(r.headers.get("Access-Control-Allow-Origin"))
    origins = ", ".join(sorted(origin for origin in allowed if origin)) or "none"
    return f"{', '.join(answers)}; Access-Control-Allow-Origin: {origins}"


async def big_bodies(target: Target) -> str:
    """8 token-id prompts and 4 ``logit_bias`` maps of ``body_mb`` MB each, all at once, in rounds until the
    time is up."""
    size = int(target.body_mb * 1e6)
    head = b'{"model": %s, "max_tokens": 1, ' % json.dumps(target.model).encode()
    prompt = head + b'"prompt": [' + b"5," * (size // 2) + b"5]}"
    bias = b",".join(b'"%d": 1' % token for token in range(size // 10))
    logit_bias = head + b'"prompt": "ROMEO:", "logit_bias": {' + bias + b"}}"
    prompts, biases, deadline = list[int](), list[int](), time.monotonic() + target.seconds
    while time.monotonic() < deadline:
        answers = await asyncio.gather(
            *(post(target, prompt) for _ in range(8)), *(post(target, logit_bias) for _ in range(4))
        )
        prompts, biases = prompts + answers[:8], biases + answers[8:]
    mb = f"{target.body_mb:g} MB"
    return f"token-id prompts of {mb}: {tally(prompts)}; logit_bias maps of {mb}: {tally(biases)}"


async def slow_schemas(target: Target) -> str:
    """8 completions constrained by a JSON schema of ``schema_depth`` nested arrays, whose clients give up
    after ``seconds`` (the victim's chat request shows whether templates wait behind the compiles)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(target.schema_depth):
        schema = {"type": "array", "items": schema}
    body = target.body(structured_outputs={"json": schema})
    statuses = await asyncio.gather(*(post(target, body, timeout=target.seconds) for _ in range(8)))
    return f"8 schemas {target.schema_depth} deep: {tally(list(statuses))}"


async def held(target: Target, idle: bool) -> float | None:
    """A connection held for ``idle_seconds``: idle after a /health (keep-alive), or sending its headers a
    line a second. The seconds after which the server closed it (or answered), None if it stayed open."""
    started = time.monotonic()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), 10)
    try:
        writer.write(
            b"%s HTTP/1.1\r\nHost: %s:%d\r\n"
            % (b"GET /health" if idle else b"POST /v1/completions", target.host.encode(), target.port)
        )
        if idle:
            writer.write(b"\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = next(
                int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")
            )
            await asyncio.wait_for(reader.readexactly(length), 10)
        while (left := started + target.idle_seconds - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(reader.read(1024), min(left, 1.0))
                return time.monotonic() - started
            except TimeoutError:
                writer.write(b"" if idle else b"X-Slow: 1\r\n")
        return None
    except (ConnectionError, asyncio.IncompleteReadError):
        return time.monotonic() - started
    finally:
        writer.close()


def closed(times: list[float | None]) -> str:
    ends = sorted(t for t in times if t is not None)
    return f"{len(ends)} closed, after {ends[0]:.1f}-{ends[-1]:.1f} s" if ends else "none closed"


async def slowloris(target: Target) -> str:
    """64 connections sending their headers a line a second and 64 idle keep-alive ones, held for
    ``idle_seconds``: does the server close them, and when."""
    times = await asyncio.gather(*(held(target, idle=i % 2 == 1) for i in range(128)))
    slow, idle = closed(times[::2]), closed(times[1::2])
    return f"in {target.idle_seconds:g} s: 64 half-sent headers {slow}; 64 idle keep-alive {idle}"


async def raw_post(
    target: Target, body: bytes, auth: bytes | None = None, leave_after: float | None = None
) -> int:
    """POST a completion over a raw connection (``auth``: the Authorization value; default: the API key's):
    the answer's status, 0 when none came within 10 s or the client left ``leave_after`` s after sending."""
    auth = auth if auth is not None else b"Bearer %s" % target.api_key.encode() if target.api_key else b""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), 10)
    try:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n" % (target.host.encode(), target.port)
        head += b"Authorization: %s\r\n" % auth if auth else b""
        writer.write(
            head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        if leave_after is not None:
            await asyncio.sleep(leave_after)
            return 0
        line = await asyncio.wait_for(reader.readline(), 10)
        return int(line.split()[1]) if line.startswith(b"HTTP/") else 0
    except (TimeoutError, ConnectionError):
        return 0
    finally:
        writer.close()


async def error_bodies(target: Target) -> str:
    """``'[' * 100000``, a non-ASCII byte in ``Authorization`` (checked only with an API key), and streaming
    clients that leave before their response headers: each once made a 500 or a traceback."""
    nested = await post(target, b"[" * 100_000)
    bad_auth = await raw_post(target, json.dumps(target.body()).encode(), auth=b"Bearer \xff")
    stream = json.dumps(target.body(max_tokens=32, stream=True)).encode()
    left, deadline = 0, time.monotonic() + target.seconds
    while time.monotonic() < deadline and left < 200:
        left += 1
        await raw_post(target, stream, leave_after=0.001 * (left % 10))  # at different points of the handler
    return (
        f"'['×100000: {nested}; \\xff in Authorization: {bad_auth}; {left} streams left before their headers"
    )
