"""The official openai client against the frontend: what users and vLLM-compatible tools actually run."""

from __future__ import annotations

import openai
import pytest

from tests.frontend import tiny_tokenizer
from tests.frontend.conftest import Frontend, FrontendFactory, PeerFactory


@pytest.fixture
async def keyed_frontend(start_frontend: FrontendFactory, start_peer: PeerFactory) -> Frontend:
    frontend = await start_frontend(api_key="sesame")
    await start_peer(frontend)
    return frontend


def make_client(frontend: Frontend, api_key: str = "sesame") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key=api_key, max_retries=0, timeout=10)


async def test_openai_client_completes(keyed_frontend: Frontend) -> None:
    """completions.create parses our response: text, finish_reason "length", usage."""
    async with make_client(keyed_frontend) as client:
        completion = await client.completions.create(model="tiny", prompt="hello world", max_tokens=2)
    tokenizer = tiny_tokenizer.make_tokenizer()
    assert completion.choices[0].text == tokenizer.decode(tokenizer.encode("hello world")[:2])
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 2


async def test_openai_client_streams(keyed_frontend: Frontend) -> None:
    """stream=True yields chunks whose texts join to the non-streamed text, then a usage chunk."""
    async with make_client(keyed_frontend) as client:
        whole = await client.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=5)
        chunks = [
            chunk
            async for chunk in await client.completions.create(
                model="tiny", prompt="the quick brown fox", max_tokens=5, stream=True,
                stream_options={"include_usage": True},
            )
        ]  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


async def test_openai_client_sees_typed_errors(keyed_frontend: Frontend) -> None:
    """A wrong key, an unknown model and max_tokens=0 raise the client's typed errors (401, 404, 400)."""
    async with make_client(keyed_frontend, api_key="wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.completions.create(model="tiny", prompt="hi")
    async with make_client(keyed_frontend) as client:
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="gpt-4", prompt="hi")
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            await client.completions.create(model="tiny", prompt="hi", max_tokens=0)
        models = await client.models.list()
        assert [m.id for m in models.data] == ["tiny"]
