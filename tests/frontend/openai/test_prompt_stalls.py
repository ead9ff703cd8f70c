"""No request stalls the others: a huge prompt is refused before it is decoded or tokenized, a long one is
tokenized off the event loop, and /health answers meanwhile (how fast is benchmarks/request_stalls.py's
business: tests hold what happens, never how quickly)."""

from __future__ import annotations

import pytest

from openinfer.benchmarks.health_during_prompt import post_while_polling_health, random_words
from tests.frontend.conftest import Frontend, FrontendFactory, PeerFactory
from tests.frontend.engine_peer import EnginePeer, PeerConfig


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


async def test_long_prompt_is_tokenized_off_the_event_loop(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """1.2 M characters on a 100,000-token model fit the character bound (1.3 M), so they are tokenized (about
    2 s here) before the token count refuses them; /health answers again and again meanwhile (on the event
    loop the tokenizing would hold every poll until it ended)."""
    frontend = await start_frontend()
    await start_peer(frontend, PeerConfig(max_model_len=100_000))
    body = {"prompt": random_words(1_200_000), "max_tokens": 1}
    status, got, _, latencies = await post_while_polling_health(frontend.url, "/v1/completions", body, 0.02)
    assert status == 400 and "input tokens, which exceeds this limit" in got["error"]["message"]
    assert len(latencies) > 10  # /health polls answered while it was tokenized (polled one after another)
