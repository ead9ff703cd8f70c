"""Issue 39's attack on the ``n`` choices of a streamed request: clients that cut their stream as
``curl ... | head -c 300`` does, and the choices that run on after them on the engine."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
import time
from typing import Any

from aiohttp.web_protocol import MAX_MSG_QUEUE_SIZE

from openinfer.benchmarks.attack_target import Target, metric_sum

CHOICES = 16  # n of each request: one engine step's tokens of every choice reach the client in one burst
MAX_TOKENS = 600  # the report's: minutes of work for the built-in model, had the cut choices run on
SETTLE_S = 2.0  # how long after its cut a choice may still draft (its abort on its way to the engine)
READ_TIMEOUT_S = 30.0  # bound on each read of a stream


async def cut_stream(host: str, port: int, body: dict[str, Any], api_key: str | None = None) -> str | None:
    """POST a streamed completion, read until a chunk of a choice other than 0 comes (choice 0's first chunk
    comes alone, the others' in bursts), then reset the connection at once, as a client killed mid-read
    does: the response's id, or None when the server streamed no such chunk (it refused or failed the
    request).

    Behind the request go as many pipelined ``GET /health`` as aiohttp queues before it stops reading a
    connection (until the stream ends), so the frontend learns of the reset from a write, never a read: the
    write fails, the next of the same burst raises ConnectionError, and aiohttp cancels the handler as soon
    as the loop runs again, while the choices are being left. That is the order in which ``curl | head``
    broke them when its reset reached the frontend mid-burst; here it does not depend on that race.
    """
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), READ_TIMEOUT_S)
    try:
        payload = json.dumps(body).encode()
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        head += f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        queued = f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n" * MAX_MSG_QUEUE_SIZE
        writer.write(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload + queued.encode())
        received = b""
        while not re.search(rb'"index":[1-9]', received):
            chunk = await asyncio.wait_for(reader.read(65536), READ_TIMEOUT_S)
            if not chunk:
                return None
            received += chunk
        found = re.search(rb'"id":"([^"]+)"', received)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close: a reset
        return None if found is None else found.group(1).decode()
    finally:
        writer.transport.abort()


def late_choices(target: Target, cuts: dict[str, float]) -> tuple[int, float]:
    """Of the choices of the cut streams (response id: unix time of its cut), how many drafted a round more
    than SETTLE_S after their cut, by the spec logs, and how long after its cut the last round came."""
    late: set[str] = set()
    longest = 0.0
    for log in target.spec_log_dir.glob("*.jsonl"):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            index, _, response_id = record["request_id"].partition("_")
            cut = cuts.get(response_id)
            if index.isdigit() and cut is not None and record["time"] > cut + SETTLE_S:
                late.add(record["request_id"])
                longest = max(longest, record["time"] - cut)
    return len(late), longest


async def cut_choice_streams(target: Target) -> str:
    """Streamed completions of n=CHOICES, MAX_TOKENS each, cut one after the other after their first burst
    for about ``seconds`` (one still waiting for its burst then is given up: the engine is busy, with the
    choices of earlier cuts if they ran on); then, SETTLE_S after, how many choices drafted more than SETTLE_S
    after their cut (by the spec logs: it needs a drafter) and how many requests the engines still run."""
    body = target.body(max_tokens=MAX_TOKENS, n=CHOICES, temperature=1, stream=True, ignore_eos=True)
    cuts: dict[str, float] = {}
    refused, waiting, deadline = 0, 0, time.monotonic() + target.seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            response_id = await asyncio.wait_for(
                cut_stream(target.host, target.port, body, target.api_key), left
            )
        except TimeoutError:
            waiting += 1
            break
        if response_id is None:
            refused += 1
        else:
            cuts[response_id] = time.time()  # the spec logs' clock
    await asyncio.sleep(SETTLE_S)
    running = await metric_sum(target, "vllm:num_requests_running")
    late, longest = late_choices(target, cuts)
    last = f" (one {longest:.1f} s after)" if late else ""
    return (
        f"{len(cuts)} streams of n={CHOICES} cut after their first burst ({refused} not streamed, {waiting} "
        f"still waiting for it at the end): {late} of {len(cuts) * CHOICES} choices drafted over "
        f"{SETTLE_S:g} s after their cut{last}; {running:g} requests running {SETTLE_S:g} s after the last cut"
    )
