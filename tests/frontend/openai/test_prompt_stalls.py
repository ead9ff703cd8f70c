"""No request stalls the others: a huge prompt is refused before it is tokenized, a long one is tokenized off
the event loop, and /health answers at once meanwhile."""

from __future__ import annotations

import pytest

from openinfer.benchmarks.health_during_prompt import post_while_polling_health, random_words
from tests.frontend.conftest import Frontend, FrontendFactory, PeerFactory
from tests.frontend.engine_peer import EnginePeer, PeerConfig

_HEALTH_BOUND_S = 0.3  # the loop's own share: reading and decoding a body of megabytes


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
    status, got, took, latencies = await post_while_polling_health(frontend.url, path, body, 0.02)
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
    status, got, took, latencies = await post_while_polling_health(
        frontend.url, "/v1/completions", body, 0.02
    )
    assert status == 400 and "input tokens, which exceeds this limit" in got["error"]["message"]
    assert took > 0.5 and len(latencies) > 10  # it was tokenized, and /health was asked meanwhile
    assert max(latencies) < _HEALTH_BOUND_S, max(latencies)
