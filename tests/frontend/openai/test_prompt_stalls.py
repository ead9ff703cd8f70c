"""No request stalls the others: a huge prompt is refused before it is decoded or tokenized, a long one is
tokenized off the event loop, and /health answers meanwhile (how fast is benchmarks/request_stalls.py's
business: tests hold what happens, never how quickly)."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import pytest

from openinfer.benchmarks.health_during_prompt import post_while_polling_health, random_words
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory

# Where a parsed request's prepare (tokenizing, rendering a template) is defined.
PREPARE_FILES = {"completion_request.py", "chat_request.py"}


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_huge_prompt_is_refused_at_once(frontend: Frontend, peer: EnginePeer, endpoint: str) -> None:
    """10 MB of text on a 64-token model: a 413 (the body is larger than any request the model can take, so
    it is not even decoded; test_body_limits shows it is refused from its head alone); nothing reaches the
    engine."""
    path, body = _prompt_body(endpoint, random_words(100_000) * 100)
    status, got, _, _ = await post_while_polling_health(frontend.url, path, body, 0.02)
    assert status == 413 and got["error"]["code"] == "request_too_large"
    assert peer.requests == {}


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_a_prompt_past_the_character_bound_is_refused_before_tokenizing(
    frontend: Frontend, peer: EnginePeer, endpoint: str
) -> None:
    """10,000 characters on a 64-token model fit the body's bound but not the context: 400 in vLLM's words
    about characters (it is never tokenized); nothing reaches the engine."""
    path, body = _prompt_body(endpoint, random_words(10_000))
    status, got, _, _ = await post_while_polling_health(frontend.url, path, body, 0.02)
    assert status == 400 and got["error"]["param"] == ("prompt" if endpoint == "completions" else "messages")
    assert (
        "characters (more than 832 characters, which is the upper bound for 64 input tokens)"
        in (got["error"]["message"])
    )  # 64 tokens x the tiny tokenizer's longest token, 13 characters
    assert peer.requests == {}


def _prompt_body(endpoint: str, text: str) -> tuple[str, dict[str, object]]:
    """The path and body of a request with ``text`` as its prompt, or as its one message."""
    if endpoint == "completions":
        return "/v1/completions", {"prompt": text, "max_tokens": 1}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}


def _preparing_off_loop() -> bool:
    """Whether a thread other than this one (the event loop's) is inside a request's ``prepare`` now."""
    loop_thread = threading.get_ident()
    for thread, frame in sys._current_frames().items():
        walk: FrameType | None = frame if thread != loop_thread else None
        while walk is not None:
            code = walk.f_code
            if code.co_name == "prepare" and PREPARE_FILES & {Path(code.co_filename).name}:
                return True
            walk = walk.f_back
    return False


async def test_long_prompt_is_tokenized_off_the_event_loop(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """1.2 M characters on a 100,000-token model fit the character bound (1.3 M), so they are tokenized before
    the token count refuses them, in another thread: this test's coroutine, on the frontend's event loop, runs
    while that thread is inside the request's prepare, and /health answers then (on the loop the tokenizing
    would hold every coroutine until it ended, so the wait below would never see it)."""
    frontend = await start_frontend()
    await start_peer(frontend, PeerConfig(max_model_len=100_000))
    body = {"prompt": random_words(1_200_000), "max_tokens": 1}
    async with aiohttp.ClientSession() as session:

        async def post() -> tuple[int, Any]:
            async with session.post(f"{frontend.url}/v1/completions", json=body) as r:
                return r.status, await r.json()

        answer = asyncio.create_task(post())
        async with asyncio.timeout(60):  # bounds the wait for the prompt to be in prepare
            while not _preparing_off_loop():
                assert not answer.done(), f"answered before it was seen being prepared: {answer.result()}"
                await asyncio.sleep(0.001)
        async with session.get(f"{frontend.url}/health") as r:
            assert r.status == 200
        status, got = await asyncio.wait_for(answer, 120)
    assert status == 400 and "input tokens, which exceeds this limit" in got["error"]["message"]
