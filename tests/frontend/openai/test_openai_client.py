"""The official openai client against the frontend and a real ``--fake-model`` engine: what users and
vLLM-compatible tools actually run."""

from __future__ import annotations

import openai
import pytest

from openinfer.engine_core.worker.fake_model_runner import FAKE_CYCLE, FIRST_CYCLE_TOKEN
from tests.frontend.frontends import FakeFrontendFactory, Frontend


@pytest.fixture
async def keyed_frontend(start_fake_frontend: FakeFrontendFactory) -> Frontend:
    return await start_fake_frontend(api_key="sesame")


def make_client(frontend: Frontend, api_key: str = "sesame") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key=api_key, max_retries=0, timeout=10)


def cycle_after(token_id: int, n: int) -> list[int]:
    """The fake model's greedy output after ``token_id``: the next n tokens of its cycle (a token outside the
    cycle is followed by the cycle's first)."""
    offset = token_id - FIRST_CYCLE_TOKEN + 1 if 0 <= token_id - FIRST_CYCLE_TOKEN < FAKE_CYCLE else 0
    return [FIRST_CYCLE_TOKEN + (offset + i) % FAKE_CYCLE for i in range(n)]


async def test_openai_client_completes(keyed_frontend: Frontend) -> None:
    """completions.create parses our response: the greedy text, finish_reason "length", usage."""
    async with make_client(keyed_frontend) as client:
        completion = await client.completions.create(
            model="fake", prompt="hello world", max_tokens=2, temperature=0
        )
    model = keyed_frontend.client.served_model("fake")
    assert model is not None
    prompt_ids = model.tokenizer.encode("hello world")
    assert completion.choices[0].text == model.tokenizer.decode(cycle_after(prompt_ids[-1], 2))
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 2


async def test_openai_client_streams(keyed_frontend: Frontend) -> None:
    """stream=True yields chunks whose texts join to the non-streamed text, then a usage chunk."""
    async with make_client(keyed_frontend) as client:
        whole = await client.completions.create(
            model="fake", prompt="the quick brown fox", max_tokens=5, temperature=0
        )
        chunks = [
            chunk
            async for chunk in await client.completions.create(
                model="fake", prompt="the quick brown fox", max_tokens=5, temperature=0, stream=True,
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
            await client.completions.create(model="fake", prompt="hi")
    async with make_client(keyed_frontend) as client:
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="gpt-4", prompt="hi")
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            await client.completions.create(model="fake", prompt="hi", max_tokens=0)
        models = await client.models.list()
        assert [m.id for m in models.data] == ["fake"]
