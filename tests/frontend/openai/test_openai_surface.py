"""Stop strings, completion logprobs, request ids, error routes and the API key, against an engine peer (its
echoed text and what reached it) or a real --fake-model engine."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import FakeFrontendFactory, Frontend, PeerFactory
from tests.frontend.openai.http_calls import request
from tests.frontend.waits import wait_until

TOKENIZER = tiny_tokenizer.make_tokenizer()
PROMPT = "hello world, the quick brown fox jumps over the lazy dog"
PROMPT_IDS = TOKENIZER.encode(PROMPT)


async def complete(frontend: Frontend, body: dict[str, Any]) -> dict[str, Any]:
    status, answer, _ = await request(frontend, "POST", "/v1/completions", {"prompt": PROMPT, **body})
    assert status == 200, answer
    return answer


async def stream(frontend: Frontend, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        url = f"{frontend.url}/v1/completions"
        async with session.post(url, json={"prompt": PROMPT, **body, "stream": True}) as response:
            raw = await response.text()
    events = [block.removeprefix("data: ") for block in raw.split("\n\n") if block]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


def tokens_through(text: str) -> int:
    """How many prompt tokens the peer must echo before its text contains ``text``."""
    return next(n for n in range(len(PROMPT_IDS) + 1) if text in TOKENIZER.decode(PROMPT_IDS[:n]))


# ---- stop strings ----


@pytest.mark.parametrize("stop", [" quick", [" lazy", "brown"], "k b"])  # "k b" spans a token boundary
async def test_stop_string_cuts_the_text_and_aborts_on_the_engine(
    frontend: Frontend, start_peer: PeerFactory, stop: str | list[str]
) -> None:
    """The text ends right before the first stop string to complete; finish_reason "stop" with the string
    as stop_reason; the engine is told to abort at once; usage counts the tokens through the one that
    completed it."""
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.01))  # still generating when it is told
    body = await complete(frontend, {"max_tokens": 40, "stop": stop})
    first = min([stop] if isinstance(stop, str) else stop, key=PROMPT.find)
    [choice] = body["choices"]
    assert choice["text"] == PROMPT[: PROMPT.find(first)]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", first)
    assert body["usage"]["completion_tokens"] == tokens_through(first)
    await wait_until(lambda: body["id"] in peer.aborted)


async def test_stop_string_in_a_stream_holds_back_only_a_possible_start(
    frontend: Frontend, peer: EnginePeer
) -> None:
    """Streamed, the chunks join to the same cut text, and after each token exactly the text that could
    still start the stop string is held back (the chunks' token ids tell what arrived)."""
    stop = "fox j"
    whole = await complete(frontend, {"max_tokens": 40, "stop": stop})
    chunks = await stream(frontend, {"max_tokens": 40, "stop": stop, "return_token_ids": True})
    choices = [c["choices"][0] for c in chunks]
    assert "".join(ch["text"] for ch in choices) == whole["choices"][0]["text"] == PROMPT[: PROMPT.find(stop)]
    assert choices[-1]["stop_reason"] == stop
    released, arrived = "", []
    for choice in choices[:-1]:
        released += choice["text"]
        arrived += choice["token_ids"]
        text = TOKENIZER.decode(arrived)
        held = max((n for n in range(len(stop)) if n and stop.startswith(text[len(text) - n :])), default=0)
        assert released == text[: len(text) - held]


async def test_include_stop_str_in_output(frontend: Frontend, peer: EnginePeer) -> None:
    """vLLM's include_stop_str_in_output keeps the stop string and nothing after it."""
    body = await complete(frontend, {"max_tokens": 40, "stop": "brown", "include_stop_str_in_output": True})
    assert body["choices"][0]["text"] == PROMPT[: PROMPT.find("brown") + len("brown")]


async def test_stop_string_that_never_occurs_changes_nothing(frontend: Frontend, peer: EnginePeer) -> None:
    """A stop string absent from the output: the whole text, finish_reason "length", no stop_reason."""
    plain = await complete(frontend, {"max_tokens": 8})
    stopped = await complete(frontend, {"max_tokens": 8, "stop": ["zebra", "dogs!"]})
    assert stopped["choices"] == plain["choices"]


async def test_stop_strings_in_chat(frontend: Frontend, peer: EnginePeer) -> None:
    """Chat honours stop strings the same way (the peer echoes the rendered prompt)."""
    status, body, _ = await request(
        frontend, "POST", "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "the lazy dog"}], "max_tokens": 30, "stop": "lazy"},
    )  # fmt: skip
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "user: the "
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["stop_reason"] == "lazy"


# ---- completion logprobs ----


async def test_completion_logprobs_have_openai_legacy_shape(frontend: Frontend, peer: EnginePeer) -> None:
    """logprobs=2: tokens, token_logprobs, top_logprobs (token text -> logprob, the sampled token
    included) and text_offset, the same streamed or not."""
    body = await complete(frontend, {"max_tokens": 4, "logprobs": 2})
    assert [r.sampling_params.logprobs for r in peer.requests.values()] == [2]
    logprobs = body["choices"][0]["logprobs"]
    tokens = [TOKENIZER.token_text(t) for t in PROMPT_IDS[:4]]
    assert logprobs["tokens"] == tokens
    assert logprobs["token_logprobs"] == [-0.5] * 4  # the peer's values
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(4)]
    assert logprobs["text_offset"] == offsets
    for token_id, top in zip(PROMPT_IDS[:4], logprobs["top_logprobs"], strict=True):
        assert top == {TOKENIZER.token_text(token_id): -0.5, TOKENIZER.token_text((token_id + 1) % 300): -1.5}
    chunks = await stream(frontend, {"max_tokens": 4, "logprobs": 2})
    joined: dict[str, list[Any]] = {key: [] for key in logprobs}
    for chunk in chunks:
        for key, values in chunk["choices"][0]["logprobs"].items():
            joined[key] += values
    assert joined == logprobs


async def test_logprobs_zero_gives_the_sampled_token_only(frontend: Frontend, peer: EnginePeer) -> None:
    """logprobs=0: each top_logprobs dict holds just the sampled token."""
    body = await complete(frontend, {"max_tokens": 2, "logprobs": 0})
    tops = body["choices"][0]["logprobs"]["top_logprobs"]
    assert tops == [{TOKENIZER.token_text(t): -0.5} for t in PROMPT_IDS[:2]]


async def test_ids_past_the_tokenizer_are_empty_text(frontend: Frontend, start_peer: PeerFactory) -> None:
    """A model may have more embedding rows than its tokenizer has tokens (Qwen3: 151,936 and 151,669): such
    an id is taken in a prompt (the engine's vocab_size bounds it) and, sampled, is "" in the text, in
    streamed deltas and as a logprobs token (vLLM's rule), never an error."""
    await start_peer(frontend, PeerConfig(vocab_size=400))  # the tiny tokenizer has ids 0..299
    ids = PROMPT_IDS[:2] + [300, 399] + PROMPT_IDS[2:4]
    body = await complete(frontend, {"prompt": ids, "max_tokens": 6, "logprobs": 1, "return_token_ids": True})
    choice = body["choices"][0]
    assert choice["token_ids"] == ids  # the peer echoes its prompt
    assert choice["text"] == TOKENIZER.decode(PROMPT_IDS[:4])
    assert choice["logprobs"]["tokens"][2:4] == ["", ""]
    assert choice["logprobs"]["top_logprobs"][2:4] == [{"": -0.5}, {"": -0.5}]
    chunks = await stream(frontend, {"prompt": ids, "max_tokens": 6})
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == choice["text"]
    status, answer, _ = await request(frontend, "POST", "/v1/completions", {"prompt": [400]})
    assert status == 400 and answer["error"]["param"] == "prompt"  # past the model's rows


# ---- request ids ----


async def test_request_id_header_is_honoured_and_echoed(frontend: Frontend, peer: EnginePeer) -> None:
    """X-Request-Id becomes the response id's suffix, comes back as a header, and names the engine
    request (with a suffix: clients may reuse ids); without one a fresh id is made and echoed."""
    headers = {"X-Request-Id": "trace-42"}
    status, body, response_headers = await request(
        frontend, "POST", "/v1/completions", {"prompt": "hi"}, headers
    )
    assert status == 200 and body["id"] == "cmpl-trace-42" and response_headers["X-Request-Id"] == "trace-42"
    [engine_id] = peer.requests
    assert engine_id.startswith("cmpl-trace-42-")
    chat_body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    _, body, response_headers = await request(frontend, "POST", "/v1/chat/completions", chat_body, headers)
    assert body["id"] == "chatcmpl-trace-42" and response_headers["X-Request-Id"] == "trace-42"
    _, body, response_headers = await request(frontend, "POST", "/v1/completions", {"prompt": "hi"})
    assert body["id"] == f"cmpl-{response_headers['X-Request-Id']}" and body["id"] in peer.requests


async def test_streams_and_errors_echo_the_request_id(fake_frontend: Frontend) -> None:
    """The header is on streamed responses and on error responses too."""
    frontend = fake_frontend
    headers = {"X-Request-Id": "abc"}
    async with aiohttp.ClientSession() as session:
        url = f"{frontend.url}/v1/completions"
        async with session.post(url, json={"prompt": "hi", "stream": True}, headers=headers) as response:
            assert response.headers["X-Request-Id"] == "abc"
            first = await response.content.readline()
            assert json.loads(first.removeprefix(b"data: "))["id"] == "cmpl-abc"
    status, _, response_headers = await request(frontend, "POST", "/v1/completions", {"n": 3}, headers)
    assert status == 400 and response_headers["X-Request-Id"] == "abc"


@pytest.mark.parametrize("value", ["has space", "x" * 257])
async def test_bad_request_id_is_400(fake_frontend: Frontend, value: str) -> None:
    """An X-Request-Id that is too long or has spaces is refused, saying what it must be."""
    status, body, _ = await request(
        fake_frontend, "POST", "/v1/completions", {"prompt": "hi"}, {"X-Request-Id": value}
    )
    assert status == 400 and "X-Request-Id" in body["error"]["message"]


# ---- errors and the API key ----


async def test_wrong_method_is_an_openai_405_with_allow(frontend: Frontend) -> None:
    """GET on a POST route is 405 in OpenAI's shape, naming the allowed method (Allow header kept)."""
    status, body, headers = await request(frontend, "GET", "/v1/chat/completions")
    assert status == 405 and set(body["error"]) == {"message", "type", "param", "code"}
    assert "POST" in body["error"]["message"] and headers["Allow"] == "POST"


async def test_unknown_route_names_the_routes(frontend: Frontend) -> None:
    """An unknown route is 404 in OpenAI's shape, listing the API's routes."""
    status, body, _ = await request(frontend, "POST", "/v1/embeddings", {"input": "x"})
    assert status == 404 and "/v1/chat/completions" in body["error"]["message"]


async def test_api_key_guards_chat_and_admin(start_fake_frontend: FakeFrontendFactory) -> None:
    """With --api-key, chat and admin routes answer 401 without the key and work with it (a real engine)."""
    frontend = await start_fake_frontend(api_key="sesame")
    chat_body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for headers in [None, {"Authorization": "Bearer nope"}]:
        assert (await request(frontend, "POST", "/v1/chat/completions", chat_body, headers))[0] == 401
        assert (await request(frontend, "GET", "/admin/engines", None, headers))[0] == 401
        assert (await request(frontend, "DELETE", "/admin/engines/0/drafter", None, headers))[0] == 401
    key = {"Authorization": "Bearer sesame"}
    assert (await request(frontend, "POST", "/v1/chat/completions", chat_body, key))[0] == 200
    assert (await request(frontend, "GET", "/admin/engines", None, key))[0] == 200
