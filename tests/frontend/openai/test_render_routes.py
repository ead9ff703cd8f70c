"""vLLM's render routes: their shapes, token ids equal to what /tokenize answers and what the generation routes
send the engine for the same body, the keys routers add to bodies (taken by render and generation alike),
errors, 503 and the API key."""

from __future__ import annotations

from typing import Any

import pytest

from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import EnginePeer
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.openai.http_calls import MESSAGES, chat, post

TOKENIZER = tiny_tokenizer.make_tokenizer()
TEXT = "hello world, the quick brown fox"
REQUEST_ID = {"X-Request-Id": "r1"}
# vLLM 0.32's prompt ids for one user message "hi" on the built-in tokenizer (the fake engine's): its ChatML turn
BUILTIN_CHAT_HI = [1, 391, 275, 201, 375, 2, 201, 1, 356, 85, 272, 86, 443, 201]
# What vllm-router and sglang-router add to a completion body they forward, and to a chat body (with
# sglang-router's max_completion_tokens for the client's max_tokens).
ROUTER_COMPLETION_KEYS = {"stream": False, "echo": False, "no_stop_trim": False, "ignore_eos": False,
                          "skip_special_tokens": True, "return_hidden_states": False}  # fmt: skip
ROUTER_CHAT_KEYS = {"stream": False, "logprobs": False, "no_stop_trim": False, "ignore_eos": False,
                    "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
                    "stream_reasoning": True, "return_hidden_states": False, "include_reasoning": True,
                    "max_completion_tokens": 2}  # fmt: skip


async def render(frontend: Frontend, body: object, chat_form: bool = False, **kwargs: Any) -> tuple[int, Any]:
    path = "/v1/chat/completions/render" if chat_form else "/v1/completions/render"
    return await post(frontend, body, path=path, **kwargs)


async def test_completion_render_gives_the_ids_completions_sends(
    frontend: Frontend, peer: EnginePeer
) -> None:
    """vLLM's list of one GenerateRequest: the ids /tokenize answers, the prompt /v1/completions sends the
    engine for the same body (router keys included) and counts in its usage; the request id is the response's."""
    body = {"model": "tiny", "prompt": TEXT, "max_tokens": 2, **ROUTER_COMPLETION_KEYS}
    status, rendered = await render(frontend, body, headers=REQUEST_ID)
    assert status == 200, rendered
    _, tokenized = await post(frontend, {"prompt": TEXT}, path="/tokenize")
    status, completion = await post(frontend, body)
    assert status == 200, completion
    sent = peer.requests[completion["id"]].prompt_token_ids
    assert rendered == [{"request_id": "cmpl-r1", "token_ids": sent, "model": "tiny", "sampling_params": {},
                         "token_offsets": None}]  # fmt: skip
    assert tokenized["tokens"] == sent and completion["usage"]["prompt_tokens"] == len(sent)
    assert TOKENIZER.decode(sent) == TEXT and len(peer.requests) == 1  # render ran nothing


async def test_completion_render_takes_a_batch(frontend: Frontend, peer: EnginePeer) -> None:
    """Each prompt of a batch (texts or token ids) rendered as that prompt alone, entry i ``cmpl-<id>-<i>``;
    a single prompt in a list is one entry without a suffix."""
    status, rendered = await render(frontend, {"prompt": [TEXT, [5, 6, 7]]}, headers=REQUEST_ID)
    assert status == 200, rendered
    assert [(r["request_id"], r["token_ids"]) for r in rendered] == [
        ("cmpl-r1-0", TOKENIZER.encode(TEXT)),
        ("cmpl-r1-1", [5, 6, 7]),
    ]
    _, one = await render(frontend, {"prompt": [[5, 6, 7]]}, headers=REQUEST_ID)
    assert [(r["request_id"], r["token_ids"]) for r in one] == [("cmpl-r1", [5, 6, 7])]
    status, body = await post(frontend, {"prompt": [TEXT, [5, 6, 7]]})  # completions still takes one
    assert status == 400 and body["error"]["param"] == "prompt"


async def test_chat_render_gives_the_ids_chat_sends(frontend: Frontend, peer: EnginePeer) -> None:
    """One GenerateRequest: the messages rendered by the model's template and tokenized, as /tokenize and
    /v1/chat/completions (given the very body routers forward) make them."""
    body = {"model": "tiny", "messages": MESSAGES, **ROUTER_CHAT_KEYS}
    status, rendered = await render(frontend, body, chat_form=True, headers=REQUEST_ID)
    assert status == 200, rendered
    _, tokenized = await post(frontend, {"messages": MESSAGES}, path="/tokenize")
    status, completion = await chat(frontend, body)
    assert status == 200, completion
    sent = peer.requests[completion["id"]].prompt_token_ids
    assert rendered == {
        "request_id": "chatcmpl-r1",
        "token_ids": sent,
        "model": "tiny",
        "sampling_params": {},
    }
    assert tokenized["tokens"] == sent and completion["usage"]["prompt_tokens"] == len(sent)
    assert completion["usage"]["completion_tokens"] == 2  # max_completion_tokens bounds it


async def test_chat_render_on_the_builtin_tokenizer(fake_frontend: Frontend) -> None:
    """On a real engine process: vLLM's ids for one user message, which the chat's usage counts."""
    hi = {"messages": [{"role": "user", "content": "hi"}], **ROUTER_CHAT_KEYS}
    status, rendered = await render(fake_frontend, hi, chat_form=True)
    assert status == 200 and rendered["token_ids"] == BUILTIN_CHAT_HI
    _, completion = await chat(fake_frontend, hi)
    assert completion["usage"]["prompt_tokens"] == len(BUILTIN_CHAT_HI)


@pytest.mark.parametrize(
    ("chat_form", "key", "value"),
    [
        (False, "no_stop_trim", True),
        (False, "return_hidden_states", True),
        (True, "return_hidden_states", True),
        (True, "separate_reasoning", False),
        (True, "stream_reasoning", False),
        (True, "continue_final_message", True),
    ],
)
async def test_router_keys_other_than_their_defaults_are_refused(
    frontend: Frontend, peer: EnginePeer, chat_form: bool, key: str, value: object
) -> None:
    """The SGLang keys routers add are taken at their defaults only: another value asks for what openinfer
    does not do, a 400 naming the key from render and generation alike."""
    body = {"messages": MESSAGES} if chat_form else {"prompt": TEXT}
    body[key] = value
    for status, got in [
        await render(frontend, body, chat_form),
        await (chat if chat_form else post)(frontend, body),
    ]:
        assert status == 400 and got["error"]["param"] == key, got
    assert not peer.requests


@pytest.mark.parametrize(
    ("chat_form", "body", "status", "param"),
    [
        (False, b"{not json", 400, None),
        (False, {}, 400, "prompt"),
        (False, {"prompt": []}, 400, "prompt"),
        (False, {"prompt": [TEXT, ""]}, 400, "prompt"),
        (False, {"prompt": TEXT, "max_tokens": "2"}, 400, "max_tokens"),
        (False, {"prompt": " ".join(["word"] * 100)}, 400, "prompt"),  # past the peer's 64 positions
        (False, {"prompt": [300]}, 400, "prompt"),  # past the peer's vocabulary of 300
        (False, {"prompt": TEXT, "model": "gpt-4"}, 404, "model"),
        (True, {"messages": []}, 400, "messages"),
        (True, {"messages": MESSAGES, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
        (True, {"messages": MESSAGES, "model": "gpt-4"}, 404, "model"),
    ],
)
async def test_bad_bodies_are_refused_as_generation_refuses_them(
    frontend: Frontend, peer: EnginePeer, chat_form: bool, body: object, status: int, param: str | None
) -> None:
    """A body the generation route refuses is refused by its render route, with the same OpenAI error."""
    got_status, got = await render(frontend, body, chat_form)
    assert got_status == status and got["error"]["param"] == param, got
    if not (isinstance(body, dict) and isinstance(body.get("prompt"), list) and len(body["prompt"]) > 1):
        assert await (chat if chat_form else post)(frontend, body) == (got_status, got)


async def test_render_needs_an_engine_and_the_api_key(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """503 while no engine is up (the tokenizer comes from its hello); with --api-key, 401 without it."""
    frontend = await start_frontend(api_key="sesame")
    key = {"Authorization": "Bearer sesame"}
    for chat_form, body in [(False, {"prompt": TEXT}), (True, {"messages": MESSAGES})]:
        status, got = await render(frontend, body, chat_form, headers=key)
        assert status == 503 and got["error"]["code"] == "no_engine"
    await start_peer(frontend)
    for chat_form, body in [(False, {"prompt": TEXT}), (True, {"messages": MESSAGES})]:
        status, got = await render(frontend, body, chat_form)
        assert status == 401 and got["error"]["code"] == "invalid_api_key"
        assert (await render(frontend, body, chat_form, headers=key))[0] == 200
