"""How long one client's requests delay everyone else's (issue 25, item 4): `/health`'s latency, and an
unrelated chat request's time, while a client sends huge bodies, slow JSON schemas, or holds connections open.

Starts `openinfer-serve` (the built-in model on the CPU, no drafter) and runs each attack in turn:

- ``ids``: 8 completions at once, each with 60 MiB of token ids as its prompt (``--ids-mib``);
- ``bias``: 4 completions at once, each with a 40 MB ``logit_bias``;
- ``schema``: 8 completions with a 500-deep nested ``items`` JSON schema whose clients leave after 5 s,
  and a 2-token chat request sent 1 s in;
- ``slow``: 16 connections that send a request head a line a second and never finish it;
- ``objects``: 4 chat requests whose ``messages`` are 20 MB of empty objects (JSON's costliest to decode).

With ``--real-vocab`` the engine is a one-layer random model of Qwen3's vocabulary and 40960 positions
(frontend and engine started apart, as in ``health_during_prompt``): its text bound (40960 tokens of up to
128 characters) lets bodies of up to 64 MiB through, so the number fields' own bounds do the refusing.

Each prints one JSON line: the attack's answers, /health's median and worst latency while it ran (polled every
10 ms), the chat request's seconds, or how long the slow connections stayed open (at most ``--slow-cap``).

    python -m openinfer.benchmarks.request_stalls [--attacks ids,bias,schema,slow,objects] [--real-vocab]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from openinfer.benchmarks.health_during_prompt import real_vocab_model
from openinfer.engine_core.launch.local_cluster import LocalCluster

_JSON = {"Content-Type": "application/json"}


async def during(url: str, attack: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """Run ``attack`` while another process polls /health every 10 ms (in this one, the attack's own sending
    would delay the polls): its result, with /health's latencies added."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    results, sink = context.Pipe(duplex=False)
    poller = context.Process(target=poll_health, args=(url, stop, sink), daemon=True)
    poller.start()
    await asyncio.to_thread(results.recv)  # its first poll is answered: the attack starts now
    try:
        result = await attack
    finally:
        stop.set()
        latencies: list[float] = await asyncio.to_thread(results.recv)
        poller.join()
    return {
        **result,
        "health_polls": len(latencies),
        "health_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "health_max_ms": round(max(latencies) * 1000, 1),
    }


def poll_health(url: str, stop: EventType, sink: Connection) -> None:
    """GET /health every 10 ms until ``stop``; send None after the first answer, then the latencies of
    the polls after it, in seconds."""
    urllib.request.urlopen(f"{url}/health", timeout=600).read()
    sink.send(None)
    latencies = []
    while not stop.is_set():
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}/health", timeout=600) as response:
            response.read()
        latencies.append(time.monotonic() - started)
        time.sleep(0.01)
    sink.send(latencies)


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, path: str = "/v1/completions"
) -> tuple[str, float]:
    """POST ``body``: (its status, or the client error, and the seconds it took)."""
    started = time.monotonic()
    try:
        async with session.post(f"{url}{path}", data=body, headers=_JSON) as r:
            await r.read()
            outcome = str(r.status)
    except aiohttp.ClientError as e:
        outcome = type(e).__name__
    return outcome, time.monotonic() - started


async def flood(url: str, body: bytes, clients: int, path: str = "/v1/completions") -> dict[str, Any]:
    """``clients`` posts of ``body`` at once: how many got each answer, and the slowest one's seconds."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        answers = await asyncio.gather(*(post(session, url, body, path) for _ in range(clients)))
    return {
        "body_mb": round(len(body) / 1e6, 1),
        "answers": dict(collections.Counter(status for status, _ in answers)),
        "slowest_s": round(max(took for _, took in answers), 2),
    }


def token_ids_body(mib: int) -> bytes:
    return b'{"prompt": [' + b"12345, " * (mib * 2**20 // 7) + b'1], "max_tokens": 2}'


def empty_objects_body(mb: int) -> bytes:
    return b'{"messages": [' + b"{}, " * (mb * 10**6 // 4) + b"{}]}"


def logit_bias_body(mb: int) -> bytes:
    entries = b", ".join(b'"%d": 1.5' % i for i in range(mb * 10**6 // 16))
    return b'{"prompt": "ROMEO:", "max_tokens": 2, "logit_bias": {' + entries + b"}}"


async def schemas_and_chat(url: str, depth: int = 500, clients: int = 8) -> dict[str, Any]:
    """``clients`` deep schemas whose clients leave after 5 s, and a 2-token chat request 1 s in."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    body = json.dumps({"prompt": "ROMEO:", "max_tokens": 2, "structured_outputs": {"json": schema}}).encode()
    chat = json.dumps({"messages": [{"role": "user", "content": "ROMEO:"}], "max_tokens": 2}).encode()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def leaving() -> str:
            try:
                return (await asyncio.wait_for(post(session, url, body), 5.0))[0]
            except TimeoutError:
                return "left after 5 s"

        schemas = [asyncio.create_task(leaving()) for _ in range(clients)]
        await asyncio.sleep(1.0)
        chat_status, chat_s = await post(session, url, chat, "/v1/chat/completions")
        answers = await asyncio.gather(*schemas)
    return {
        "schema_answers": dict(collections.Counter(answers)),
        "chat_status": chat_status,
        "chat_s": round(chat_s, 2),
    }


async def slow_heads(url: str, connections: int = 16, cap_s: float = 30.0) -> dict[str, Any]:
    """``connections`` that send a head a line a second: how long each stayed open (``cap_s`` at most)."""
    address = urlsplit(url)
    assert address.hostname is not None and address.port is not None

    async def one() -> float:
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        started = time.monotonic()
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {address.netloc}\r\n".encode())
        try:
            while time.monotonic() - started < cap_s:
                try:
                    if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                        break  # closed by the server
                except TimeoutError:
                    writer.write(b"X-Slow: a\r\n")
        except ConnectionError:
            pass
        finally:
            writer.close()
        return time.monotonic() - started

    open_s = await asyncio.gather(*(one() for _ in range(connections)))
    return {"connections": connections, "open_max_s": round(max(open_s), 1), "cap_s": cap_s}


ATTACKS: dict[str, Callable[[str, argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "ids": lambda url, args: flood(url, token_ids_body(args.ids_mib), 8),
    "bias": lambda url, _: flood(url, logit_bias_body(40), 4),
    "schema": lambda url, _: schemas_and_chat(url),
    "slow": lambda url, args: slow_heads(url, cap_s=args.slow_cap),
    "objects": lambda url, _: flood(url, empty_objects_body(20), 4, "/v1/chat/completions"),
}


async def run(url: str, attacks: list[str], args: argparse.Namespace) -> None:
    for attack in attacks:
        result = await during(url, ATTACKS[attack](url, args))
        print(json.dumps({"attack": attack, **result}), flush=True)
        await asyncio.sleep(5.0)  # what the attack left running ends before the next one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated, run in this order")
    parser.add_argument("--slow-cap", type=float, default=30.0, help="seconds a slow connection is held")
    parser.add_argument("--ids-mib", type=int, default=60, help="MiB of token ids in each ids prompt")
    parser.add_argument("--real-vocab", action="store_true", help="Qwen3's vocabulary, 40960 positions")
    args = parser.parse_args()
    attacks = args.attacks.split(",")
    unknown = set(attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks {sorted(unknown)}: choose among {', '.join(ATTACKS)}")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp) / "logs")
        try:
            if args.real_vocab:
                cluster.start_frontend("--log-level", "warning")
                model = real_vocab_model(Path(tmp) / "model")
                cluster.start_engine(model, 0, "--served-model-name", "real-vocab", "--kv-cache-gb", "0.05")
            else:
                cluster.start_serve("--device", "cpu", "--no-spec", "--log-level", "warning")
            cluster.wait_healthy(180)
            asyncio.run(run(cluster.url, attacks, args))
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
