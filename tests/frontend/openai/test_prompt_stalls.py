"""No request stalls the others: a huge prompt is refused before it is tokenized, a long one is tokenized off
the event loop, and /health answers at once meanwhile."""

from __future__ import annotations

import asyncio
import random
import string
import time
from typing import Any

import aiohttp
import pytest

from tests.frontend.conftest import Frontend, FrontendFactory, PeerFactory
from tests.frontend.engine_peer import EnginePeer, PeerConfig

_HEALTH_BOUND_S = 0.3  # the loop's own share: reading and decoding a body of megabytes


def random_words(num_chars: int, seed: int = 0) -> str:
    """Text of distinct random words (the tokenizer's word cache cannot make it cheap)."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < num_chars:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8)))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:num_chars]


async def post_while_polling_health(
    frontend: Frontend, path: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any], float, list[float]]:
    """(status, JSON body, seconds it took) of one request, and the latency of each /health polled every
    20 ms while it ran."""
    latencies: list[float] = []
    done = asyncio.Event()
    async with aiohttp.ClientSession() as session:

        async def poll() -> None:
            while not done.is_set():
                started = time.monotonic()
                async with session.get(f"{frontend.url}/health") as response:
                    assert response.status == 200
                latencies.append(time.monotonic() - started)
                await asyncio.sleep(0.02)

        poller = asyncio.create_task(poll())
        await asyncio.sleep(0.1)
        started = time.monotonic()
        async with session.post(f"{frontend.url}{path}", json=body) as response:
            status, got = response.status, await response.json()
        took = time.monotonic() - started
        done.set()
        await poller
    return status, got, took, latencies


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_huge_prompt_is_refused_at_once(frontend: Frontend, peer: EnginePeer, endpoint: str) -> None:
    """10 MB of text on a 64-token model: 400 in vLLM's words about characters, well under a second (it
    is never tokenized); /health stays fast; nothing reaches the engine."""
    text = random_words(100_000) * 100
    if endpoint == "completions":
        path, body, param = "/v1/completions", {"prompt": text, "max_tokens": 1}, "prompt"
    else:
        path, body, param = (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": text}]},
            "messages",
        )
    status, got, took, latencies = await post_while_polling_health(frontend, path, body)
    assert status == 400 and got["error"]["param"] == param
    assert (
        "characters (more than 832 characters, which is the upper bound for 64 input tokens)"
        in (got["error"]["message"])
    )  # 64 tokens x the tiny tokenizer's longest token, 13 characters
    assert took < 1.0 and max(latencies) < _HEALTH_BOUND_S, (took, max(latencies))
    assert peer.requests == {}


async def test_long_prompt_is_tokenized_off_the_event_loop(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """1.2 M characters on a 100,000-token model fit the character bound (1.3 M), so they are tokenized (about
    2 s here) before the token count refuses them; /health answers within its bound all the while."""
    frontend = await start_frontend()
    await start_peer(frontend, PeerConfig(max_model_len=100_000))
    body = {"prompt": random_words(1_200_000), "max_tokens": 1}
    status, got, took, latencies = await post_while_polling_health(frontend, "/v1/completions", body)
    assert status == 400 and "input tokens, which exceeds this limit" in got["error"]["message"]
    assert took > 0.5 and len(latencies) > 10  # it was tokenized, and /health was asked meanwhile
    assert max(latencies) < _HEALTH_BOUND_S, max(latencies)
