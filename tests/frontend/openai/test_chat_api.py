"""POST /v1/chat/completions against an engine peer: the chat template, OpenAI's chat shapes, streaming."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from openinfer.frontend.openai.chat_request import parse_chat_request
from openinfer.frontend.openai.chat_template import compile_chat_template
from openinfer.protocol import SpecDecodeCounters
from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.openai.http_calls import MESSAGES, chat, chat_stream

TOKENIZER = tiny_tokenizer.make_tokenizer()
# What the tiny template makes of MESSAGES (text parts are joined by newlines).
PROMPT = "system: the quick brown fox\nuser: hello\nworld\nassistant:"


def echoed(n: int) -> str:
    """The peer echoes the prompt: the text of its first n tokens."""
    return TOKENIZER.decode(TOKENIZER.encode(PROMPT, add_special_tokens=False)[:n])


def test_the_tiny_template_renders_the_expected_prompt() -> None:
    """The peer's template turns MESSAGES into PROMPT (the expectation every test here builds on)."""
    messages = [MESSAGES[0], {"role": "user", "content": "hello\nworld"}]
    rendered = compile_chat_template(tiny_tokenizer.CHAT_TEMPLATE).render(messages, TOKENIZER.special_tokens)
    assert rendered == PROMPT


async def test_chat_completion_has_openai_shape(frontend: Frontend, peer: EnginePeer) -> None:
    """Non-streaming: the prompt is the rendered template (no special tokens added), the answer is a
    chat.completion with an assistant message, finish_reason, logprobs null and usage."""
    status, body = await chat(frontend, {"model": "tiny", "messages": MESSAGES, "max_tokens": 4})
    assert status == 200, body
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "tiny" and isinstance(body["created"], int)
    prompt_ids = TOKENIZER.encode(PROMPT, add_special_tokens=False)
    [engine_request] = peer.requests.values()
    assert engine_request.prompt_token_ids == prompt_ids
    [choice] = body["choices"]
    assert choice == {"index": 0, "message": {"role": "assistant", "content": echoed(4)}, "logprobs": None,
                      "finish_reason": "length", "stop_reason": None}  # fmt: skip
    n = len(prompt_ids)
    assert body["usage"] == {"prompt_tokens": n, "completion_tokens": 4, "total_tokens": n + 4,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


async def test_max_completion_tokens_wins_over_max_tokens(frontend: Frontend, peer: EnginePeer) -> None:
    """OpenAI's max_completion_tokens bounds the output; without any bound the model length does."""
    _, body = await chat(frontend, {"messages": MESSAGES, "max_tokens": 9, "max_completion_tokens": 3})
    assert body["usage"]["completion_tokens"] == 3
    _, body = await chat(frontend, {"messages": MESSAGES, "ignore_eos": True})
    assert body["usage"]["total_tokens"] == 64  # the peer's max_model_len


async def test_streaming_chat_has_openai_chunks(frontend: Frontend, peer: EnginePeer) -> None:
    """Role chunk first, content chunks that join to the non-streamed content, finish_reason on the last
    choice chunk, then the usage chunk and [DONE]; every chunk is a chat.completion.chunk with one id."""
    body = {"messages": MESSAGES, "max_tokens": 6}
    _, whole = await chat(frontend, body)
    events = await chat_stream(frontend, {**body, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert all("role" not in ch["delta"] for ch in choices[1:])
    assert (
        "".join(ch["delta"].get("content", "") for ch in choices) == whole["choices"][0]["message"]["content"]
    )
    assert [ch["finish_reason"] for ch in choices] == [None] * (len(choices) - 1) + ["length"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


async def test_chat_logprobs(frontend: Frontend, peer: EnginePeer) -> None:
    """logprobs + top_logprobs: per token its text, logprob and bytes and its top alternatives, streamed
    or not; the engine is asked for top_logprobs alternatives."""
    body = {"messages": MESSAGES, "max_tokens": 3, "logprobs": True, "top_logprobs": 2}
    _, whole = await chat(frontend, body)
    assert [r.sampling_params.logprobs for r in peer.requests.values()] == [2]
    content = whole["choices"][0]["logprobs"]["content"]
    tokens = TOKENIZER.encode(PROMPT, add_special_tokens=False)[:3]
    assert [entry["token"] for entry in content] == [TOKENIZER.token_text(t) for t in tokens]
    for token, entry in zip(tokens, content, strict=True):
        assert entry["logprob"] == -0.5 and entry["bytes"] == list(TOKENIZER.token_bytes(token))
        assert [top["logprob"] for top in entry["top_logprobs"]] == [-0.5, -1.5]  # the peer's values
        assert entry["top_logprobs"][0]["token"] == entry["token"]
    events = await chat_stream(frontend, body)
    streamed = [
        e for c in events[:-1] for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]
    ]
    assert streamed == content
    _, plain = await chat(frontend, {"messages": MESSAGES, "max_tokens": 2, "logprobs": True})
    assert all(entry["top_logprobs"] == [] for entry in plain["choices"][0]["logprobs"]["content"])


async def test_chat_carries_per_request_spec_metrics(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """The chat response has the same per-request spec-decode "metrics" object as completions."""
    frontend = await start_frontend()
    await start_peer(
        frontend,
        PeerConfig(
            spec_stats=SpecDecodeCounters(
                3, 2, 6, 3, [2, 1, 0], [0, 1, 1, 0], [2, 2, 2], 0, [2, 2, 1], [0] * 3
            )
        ),
    )
    _, body = await chat(frontend, {"messages": MESSAGES, "max_tokens": 2})
    assert body["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] == 3
    events = await chat_stream(frontend, {"messages": MESSAGES, "max_tokens": 2})
    [final] = [c for c in events[:-1] if c["choices"] and c["choices"][0]["finish_reason"]]
    assert final["metrics"] == body["metrics"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({}, "messages", "non-empty list"),
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": [{"content": "hi"}]}, "messages", "string `role`"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages", "string or a list of text parts"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages",
            "`messages[0].content[0]` is an image part ('image_url'): this server serves text only",
        ),  # fmt: skip
        (
            {"messages": [{"role": "user", "content": ["hi", {"type": "input_audio"}]}]},
            "messages",
            "`messages[0].content[0]` must be a part of type \"text\" with a string `text`, got 'str'",
        ),  # fmt: skip
        ({"messages": MESSAGES, "n": 129}, "n", "`n` must be in [1, 128]"),
        ({"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools[0].function", "Missing required"),
        ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "`logprobs: true`"),
        ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
        ({"messages": MESSAGES, "max_completion_tokens": 0}, "max_completion_tokens", "at least 1"),
        ({"messages": MESSAGES, "chat_template_kwargs": [1]}, "chat_template_kwargs", "object"),
        # wrong JSON types, blamed on their top-level field
        ({"messages": ["hi"]}, "messages", "`messages[0]` must be an object"),
        ({"messages": MESSAGES, "logprobs": 1}, "logprobs", "`logprobs` must be true or false"),
        ({"messages": MESSAGES, "max_completion_tokens": 2.0}, "max_completion_tokens", "must be an integer"),
        ({"messages": MESSAGES, "stop": [None]}, "stop", "a string or a list of strings"),
        ({"messages": MESSAGES, "add_generation_prompt": "no"}, "add_generation_prompt", "true or false"),
        (
            {"messages": MESSAGES, "response_format": {"type": "structural_tag"}},
            "response_format",
            "not supported",
        ),
    ],
)
async def test_bad_chat_requests_are_400(
    frontend: Frontend, peer: EnginePeer, body: dict[str, Any], param: str, words: str
) -> None:
    """Each bad chat body is a 400 invalid_request_error naming the parameter, with a clear message."""
    status, answer = await chat(frontend, body)
    assert status == 400, answer
    assert answer["error"]["param"] == param and words in answer["error"]["message"]
    assert not peer.requests


def test_null_chat_fields_mean_their_defaults() -> None:
    """null is as good as absent: the generation prompt on, no logprobs, no template kwargs, no bound; a
    message's other keys reach the template as given."""
    names = ["add_generation_prompt", "logprobs", "top_logprobs", "chat_template_kwargs",
             "max_completion_tokens", "max_tokens", "tools", "tool_choice", "response_format"]  # fmt: skip
    nulls = dict.fromkeys(names)
    messages = [{"role": "user", "content": None, "name": "bob"}]
    chat = parse_chat_request(json.dumps({"messages": messages, **nulls}).encode())
    assert (chat.add_generation_prompt, chat.template_kwargs) == (True, {})
    assert (chat.options.logprobs, chat.options.max_tokens) == (None, None)
    assert chat.messages == [{"role": "user", "content": "", "name": "bob"}]  # null content is ""


async def test_model_without_a_chat_template_is_400(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """A model whose tokenizer_config.json has no chat_template cannot chat: 400 saying so; completions
    still work."""
    frontend = await start_frontend()
    await start_peer(frontend, PeerConfig(tokenizer_config_json=b'{"eos_token": "<|endoftext|>"}'))
    status, body = await chat(frontend, {"messages": MESSAGES})
    assert status == 400 and "has no chat template" in body["error"]["message"]
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{frontend.url}/v1/completions", json={"prompt": "hi"}) as response:
            assert response.status == 200


async def test_template_exception_is_400_with_its_message(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """A template's raise_exception (e.g. roles must alternate) reaches the client as a 400."""
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}x"
    )
    config = json.dumps({"eos_token": "<|endoftext|>", "chat_template": template}).encode()
    frontend = await start_frontend()
    await start_peer(frontend, PeerConfig(tokenizer_config_json=config))
    status, body = await chat(frontend, {"messages": MESSAGES})
    assert status == 400 and "roles must alternate" in body["error"]["message"]


async def test_chat_template_kwargs_reach_the_template(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """chat_template_kwargs (enable_thinking here) and add_generation_prompt=false reach the template."""
    template = "{{ messages[0]['content'] }}"
    template += "{% if enable_thinking is defined and not enable_thinking %} fox{% endif %}"
    template += "{% if add_generation_prompt %} dog{% endif %}"
    config = json.dumps({"eos_token": "<|endoftext|>", "chat_template": template}).encode()
    frontend = await start_frontend()
    peer = await start_peer(frontend, PeerConfig(tokenizer_config_json=config))
    messages = [{"role": "user", "content": "the"}]
    await chat(frontend, {"messages": messages, "chat_template_kwargs": {"enable_thinking": False}})
    await chat(frontend, {"messages": messages, "add_generation_prompt": False})
    prompts = [TOKENIZER.decode(r.prompt_token_ids) for r in peer.requests.values()]
    assert prompts == ["the fox dog", "the"]
