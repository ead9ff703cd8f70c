"""usage.prompt_tokens_details.cached_tokens: the prefix-cache hit the answering engine reports on a
request's first output, in whole and streamed responses of both endpoints, as the openai client reads it."""

from __future__ import annotations

import asyncio

import openai

from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.openai.http_calls import MESSAGES, chat, chat_stream, post, stream
from tests.frontend.waits import wait_until

TOKENIZER = tiny_tokenizer.make_tokenizer()
PROMPT = [50 + i for i in range(40)]  # 40 prompt tokens: 2 full KV blocks of 16 and 8 more
CACHED = 32  # what the peer says its prefix cache held: those 2 blocks


def details(usage: dict) -> dict:
    return usage["prompt_tokens_details"]


async def test_completions_report_cached_tokens(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """/v1/completions, whole and streamed (in the usage chunk only): cached_tokens is the engine's number."""
    frontend = await start_frontend()
    await start_peer(frontend, PeerConfig(num_cached_tokens=CACHED))
    status, body = await post(frontend, {"prompt": PROMPT, "max_tokens": 3})
    assert status == 200
    assert body["usage"] == {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43,
                             "prompt_tokens_details": {"cached_tokens": CACHED}}  # fmt: skip

    events = await stream(
        frontend, {"prompt": PROMPT, "max_tokens": 3, "stream_options": {"include_usage": True}}
    )
    *chunks, usage, done = events
    assert done == "[DONE]" and all(c["usage"] is None for c in chunks)
    assert usage["choices"] == [] and usage["usage"] == body["usage"]


async def test_chat_reports_cached_tokens(start_frontend: FrontendFactory, start_peer: PeerFactory) -> None:
    """/v1/chat/completions, whole and streamed: the same usage, cached_tokens included."""
    frontend = await start_frontend()
    await start_peer(frontend, PeerConfig(num_cached_tokens=16))
    body = {"messages": MESSAGES, "max_tokens": 4}
    status, whole = await chat(frontend, body)
    assert status == 200 and details(whole["usage"]) == {"cached_tokens": 16}
    assert whole["usage"]["prompt_tokens"] > 16  # the rendered chat prompt holds the 16 cached tokens
    events = await chat_stream(frontend, {**body, "stream_options": {"include_usage": True}})
    assert events[-2]["choices"] == [] and events[-2]["usage"] == whole["usage"]


async def test_nothing_cached_is_zero(frontend: Frontend, start_peer: PeerFactory) -> None:
    """An engine that reports no hit (caching off, or a cold prompt): cached_tokens 0, as OpenAI's."""
    await start_peer(frontend)
    _, body = await post(frontend, {"prompt": PROMPT, "max_tokens": 2})
    assert details(body["usage"]) == {"cached_tokens": 0}


async def test_openai_client_reads_cached_tokens(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """The official client parses usage.prompt_tokens_details.cached_tokens, whole and streamed."""
    frontend = await start_frontend()
    await start_peer(frontend, PeerConfig(num_cached_tokens=16))  # one block of either prompt
    async with openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="-", max_retries=0) as client:
        completion = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
        chunks = [
            chunk
            async for chunk in await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello world"}], max_tokens=2,
                stream=True, stream_options={"include_usage": True},
            )
        ]  # fmt: skip
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 16
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 16


async def test_cached_tokens_of_a_moved_request_are_the_answering_engines(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """A request its first engine never answered moves to another: the usage holds the number of the
    engine that answered (16), not of the one that looked the prompt up and died (32)."""
    frontend = await start_frontend(engine_timeout=30.0)
    stuck = await start_peer(frontend, PeerConfig(engine_index=0, token_delay_s=60.0, num_cached_tokens=32))
    await start_peer(frontend, PeerConfig(engine_index=1, num_cached_tokens=16))
    response = asyncio.create_task(post(frontend, {"prompt": PROMPT, "max_tokens": 3}))
    await wait_until(lambda: len(stuck.requests) == 1)  # engine 0 (the lowest index on a tie) has it
    await stuck.stop()
    status, body = await response
    assert status == 200 and body["usage"]["completion_tokens"] == 3
    assert details(body["usage"]) == {"cached_tokens": 16}


async def test_impossible_cached_tokens_are_a_protocol_error(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """More cached tokens than the prompt has cannot be true: counted as an invalid frame, reported as 0,
    and the completion itself is served."""
    await start_peer(frontend, PeerConfig(num_cached_tokens=41))
    status, body = await post(frontend, {"prompt": PROMPT, "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] == 2
    assert details(body["usage"]) == {"cached_tokens": 0}
    errors = frontend.metrics.registry.get_sample_value(
        "openinfer:protocol_errors_total", {"kind": "invalid"}
    )
    assert errors == 1.0
