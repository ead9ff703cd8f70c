"""Real processes: no request stalls the others, and what cannot fit is a 400 in vLLM's words (a body larger
than any the model can take a 413). A 10 MB prompt is refused at once while /health keeps answering;
max_tokens past the context is refused, within it cut to the room left; the admin routes are off without a
key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from openinfer.benchmarks.health_during_prompt import post_while_polling_health
from tests.e2e.processes import Cluster

MAX_MODEL_LEN = 2048  # the fake model's positions
MAX_CHARS = MAX_MODEL_LEN * 13  # the built-in tokenizer's longest token is 13 characters


@pytest.fixture(scope="module")
def limits_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A frontend without keys and one fake engine."""
    c = Cluster(tmp_path_factory.mktemp("limits"))
    try:
        c.start_frontend()
        c.start_fake_engine(0)
        c.wait_healthy()
        yield c
    finally:
        c.stop()


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with session.post(f"{url}/v1/completions", json=body) as r:
        return r.status, await r.json()


async def test_huge_prompt_is_refused_at_once_and_health_stays_fast(limits_cluster: Cluster) -> None:
    """10.5 MB of text, larger than any request the model can take: 413, and a normal request is served
    after it. 100,000 characters fit the body's bound but not the context: 400 naming the character bound."""
    url = limits_cluster.url
    huge = {"model": "fake", "prompt": "Hello world. " * 807_693}
    status, body, _, _ = await post_while_polling_health(url, "/v1/completions", huge, 0.02)
    async with aiohttp.ClientSession() as session:
        assert (await post(session, url, {"model": "fake", "prompt": "Hello", "max_tokens": 2}))[0] == 200
        long = await post(session, url, {"model": "fake", "prompt": "Hello world. " * 7_693})
    assert status == 413 and body["error"]["code"] == "request_too_large"
    status, body = long
    assert status == 400 and body["error"]["param"] == "prompt"
    assert (
        f"your prompt contains 100009 characters (more than {MAX_CHARS} characters"
        in body["error"]["message"]
    )


async def test_max_tokens_past_the_context_is_400(limits_cluster: Cluster) -> None:
    """max_tokens 2049 on a 2048-token model: vLLM's 400; 2048 is cut to the room the prompt leaves."""
    url = limits_cluster.url
    async with aiohttp.ClientSession() as session:
        status, body = await post(session, url, {"model": "fake", "prompt": [3, 4, 5], "max_tokens": 2049})
        assert (status, body["error"]["param"]) == (400, "max_tokens")
        assert body["error"]["message"] == (
            "max_tokens=2049 cannot be greater than max_model_len=2048. Please request fewer output tokens."
        )
        prompt = [3] * 2040
        status, body = await post(
            session, url, {"model": "fake", "prompt": prompt, "max_tokens": 2048, "ignore_eos": True}
        )
    assert status == 200 and body["usage"]["completion_tokens"] == 8  # 2048 - 2040


async def test_admin_routes_are_off_without_a_key(limits_cluster: Cluster) -> None:
    """No --api-key, no --admin-api-key: the admin routes answer 403 and change nothing."""
    async with aiohttp.ClientSession() as session:
        for method, path in [("GET", "/admin/engines"), ("DELETE", "/admin/engines/0/drafter")]:
            async with session.request(method, f"{limits_cluster.url}{path}") as r:
                assert r.status == 403 and (await r.json())["error"]["code"] == "admin_api_disabled"
