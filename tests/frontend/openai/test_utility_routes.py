"""vLLM's /tokenize, /detokenize and /version: their shapes, the token ids the generation endpoints send to
an engine, errors and the API key."""

from __future__ import annotations

import importlib.metadata
import json
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.openai.http_calls import MESSAGES, chat, get, post

TOKENIZER = tiny_tokenizer.make_tokenizer()
TEXT = "hello world, the quick brown fox"
# The tiny template's prompt for MESSAGES without the assistant's turn (text parts joined by a newline).
PROMPT_WITHOUT_TURN = "system: the quick brown fox\nuser: hello\nworld\n"
# vLLM 0.32's answers for the built-in tokenizer (the fake engine's), taken from `vllm serve` on a checkpoint
# that carries it: the ChatML turn of one user message, and a text ending in a special token.
BUILTIN_CHAT_HI = [1, 391, 275, 201, 375, 2, 201, 1, 356, 85, 272, 86, 443, 201]
BUILTIN_CHAT_HI_TEXT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
BUILTIN_HELLO = [260, 276, 81, 266, 273, 315, 2]
BUILTIN_HELLO_STRS = ["he", "ll", "o", "Ġw", "or", "ld", "<|im_end|>"]


async def tokenize(
    frontend: Frontend, body: object, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    return await post(frontend, body, headers, path="/tokenize")


async def detokenize(
    frontend: Frontend, body: object, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    return await post(frontend, body, headers, path="/detokenize")


def assert_error(body: Any, param: str | None, code: str | None = None) -> None:
    """An OpenAI error body naming ``param`` (and ``code`` where given)."""
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    assert body["error"]["param"] == param
    if code is not None:
        assert body["error"]["code"] == code


async def test_tokenize_a_prompt_gives_the_ids_completions_sends(
    frontend: Frontend, peer: EnginePeer
) -> None:
    """The completion form's tokens are the prompt ids /v1/completions sends the engine for the same text,
    with vLLM's response fields (token_strs null unless asked for)."""
    status, body = await tokenize(frontend, {"model": "tiny", "prompt": TEXT})
    assert status == 200, body
    _, completion = await post(frontend, {"model": "tiny", "prompt": TEXT, "max_tokens": 1})
    sent = peer.requests[completion["id"]].prompt_token_ids
    assert body == {"count": len(sent), "max_model_len": 64, "tokens": sent, "token_strs": None}
    assert len(sent) > 1 and TOKENIZER.decode(sent) == TEXT


@pytest.mark.parametrize("add_generation_prompt", [True, False])
async def test_tokenize_messages_gives_the_ids_chat_sends(
    frontend: Frontend, peer: EnginePeer, add_generation_prompt: bool
) -> None:
    """The chat form's tokens are the prompt ids /v1/chat/completions sends the engine for the same messages
    and template fields (and its usage counts them)."""
    fields = {"messages": MESSAGES, "add_generation_prompt": add_generation_prompt}
    status, body = await tokenize(frontend, fields)
    assert status == 200, body
    _, completion = await chat(frontend, {**fields, "max_tokens": 1})
    sent = peer.requests[completion["id"]].prompt_token_ids
    assert body["tokens"] == sent and body["count"] == completion["usage"]["prompt_tokens"] == len(sent)
    expected = PROMPT_WITHOUT_TURN + ("assistant:" if add_generation_prompt else "")
    assert TOKENIZER.decode(body["tokens"]) == expected


async def test_a_body_with_messages_is_a_chat(frontend: Frontend, peer: EnginePeer) -> None:
    """As vLLM's union reads it: messages make the chat form even beside a prompt."""
    _, both = await tokenize(frontend, {"prompt": TEXT, "messages": MESSAGES})
    _, chat_form = await tokenize(frontend, {"messages": MESSAGES})
    assert both == chat_form and both["tokens"] != TOKENIZER.encode(TEXT)


async def test_tokenize_counts_a_prompt_longer_than_the_context(frontend: Frontend, peer: EnginePeer) -> None:
    """Neither form is bounded by max_model_len (as vLLM's): a prompt /v1/completions refuses is counted."""
    text = " ".join(str(i) for i in range(100))
    status, body = await tokenize(frontend, {"prompt": text})
    assert status == 200 and body["count"] > 64 == body["max_model_len"]  # the peer's 64 positions
    assert (await post(frontend, {"prompt": text}))[0] == 400


async def test_tokenize_on_the_builtin_tokenizer_answers_as_vllm(fake_frontend: Frontend) -> None:
    """On a real engine process serving the built-in tokenizer: vLLM's ids for a chat and for a text ending
    in a special token, its token_strs (vocabulary spellings: "Ġ" for a space), and the chat's ids are what
    the chat completion's usage counts."""
    hi = [{"role": "user", "content": "hi"}]
    status, body = await tokenize(fake_frontend, {"model": "fake", "messages": hi})
    assert status == 200, body
    assert body == {"count": 14, "max_model_len": 2048, "tokens": BUILTIN_CHAT_HI, "token_strs": None}
    _, completion = await chat(fake_frontend, {"messages": hi, "max_tokens": 1})
    assert completion["usage"]["prompt_tokens"] == len(BUILTIN_CHAT_HI)
    _, body = await tokenize(fake_frontend, {"prompt": "hello world<|im_end|>", "return_token_strs": True})
    assert (body["tokens"], body["token_strs"]) == (BUILTIN_HELLO, BUILTIN_HELLO_STRS)
    status, body = await detokenize(fake_frontend, {"model": "fake", "tokens": BUILTIN_CHAT_HI})
    assert (status, body) == (200, {"prompt": BUILTIN_CHAT_HI_TEXT})  # special tokens written out


async def test_token_strs_spell_each_token(frontend: Frontend, peer: EnginePeer) -> None:
    """token_strs has one vocabulary spelling per token: joined, they are the byte-level text (" " is "Ġ",
    "\\n" is "Ċ"), and a special token is its own name."""
    status, body = await tokenize(frontend, {"prompt": "hello world\n<|im_end|>", "return_token_strs": True})
    assert status == 200
    assert len(body["token_strs"]) == body["count"]
    assert "".join(body["token_strs"]) == "helloĠworldĊ<|im_end|>"
    assert body["tokens"][-1] == tiny_tokenizer.IM_END_TOKEN_ID and body["token_strs"][-1] == "<|im_end|>"


async def test_add_special_tokens_defaults_per_form(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """With a tokenizer that adds BOS: a prompt gets it by default (as /v1/completions sends it), messages
    do not (as /v1/chat/completions sends them), and add_special_tokens turns either way."""
    config = json.loads(tiny_tokenizer.tokenizer_config_json())
    config.update(bos_token="<|endoftext|>", add_bos_token=True)
    peer_config = PeerConfig(tokenizer_config_json=json.dumps(config).encode())
    frontend = await start_frontend()
    peer = await start_peer(frontend, peer_config)
    bos = tiny_tokenizer.EOS_TOKEN_ID  # "<|endoftext|>" is this tokenizer's BOS too
    _, text = await tokenize(frontend, {"prompt": TEXT})
    _, completion = await post(frontend, {"prompt": TEXT, "max_tokens": 1})
    assert text["tokens"][0] == bos and text["tokens"] == peer.requests[completion["id"]].prompt_token_ids
    _, plain = await tokenize(frontend, {"prompt": TEXT, "add_special_tokens": False})
    assert plain["tokens"] == text["tokens"][1:]
    _, messages = await tokenize(frontend, {"messages": MESSAGES})
    _, completion = await chat(frontend, {"messages": MESSAGES, "max_tokens": 1})
    assert (
        messages["tokens"][0] != bos
        and messages["tokens"] == peer.requests[completion["id"]].prompt_token_ids
    )
    _, special = await tokenize(frontend, {"messages": MESSAGES, "add_special_tokens": True})
    assert special["tokens"] == [bos, *messages["tokens"]]


async def test_detokenize_round_trips(frontend: Frontend, peer: EnginePeer) -> None:
    """/detokenize gives back the text /tokenize tokenized, special tokens included, short or long; ids past
    the vocabulary (up to 2**32 - 1) add nothing, as in vLLM."""
    text = "naïve café 🙂 <|im_end|> done"
    _, body = await tokenize(frontend, {"prompt": text})
    status, back = await detokenize(frontend, {"model": "tiny", "tokens": body["tokens"]})
    assert (status, back) == (200, {"prompt": text})
    _, back = await detokenize(frontend, {"tokens": [300, *body["tokens"], 2**32 - 1]})  # ids 0..299 exist
    assert back == {"prompt": text}
    assert await detokenize(frontend, {"tokens": []}) == (200, {"prompt": ""})
    long_text = text * 300  # past INLINE_PROMPT_CHARS and INLINE_DETOKENIZE_TOKENS: both run in a thread
    _, body = await tokenize(frontend, {"prompt": long_text})
    assert body["count"] > 4096
    assert await detokenize(frontend, {"tokens": body["tokens"]}) == (200, {"prompt": long_text})


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        ("/tokenize", b"{not json", None, None),
        ("/tokenize", [TEXT], None, None),
        ("/tokenize", {}, "prompt", "missing_required_parameter"),
        ("/tokenize", {"prompt": 5}, "prompt", None),
        ("/tokenize", {"prompt": TEXT, "return_token_strs": "yes"}, "return_token_strs", None),
        ("/tokenize", {"messages": []}, "messages", None),
        ("/tokenize", {"messages": [{"content": "no role"}]}, "messages", None),
        ("/tokenize", {"messages": MESSAGES, "tools": []}, "tools", None),
        ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, "continue_final_message", None),
        ("/tokenize", {"messages": MESSAGES, "chat_template": "{{ 1 }}"}, "chat_template", None),
        ("/detokenize", {}, "tokens", "missing_required_parameter"),
        ("/detokenize", {"tokens": [-1]}, "tokens", None),
        ("/detokenize", {"tokens": [2**32]}, "tokens", None),  # no tokenizer has it: vLLM's 400 too
        ("/detokenize", {"tokens": "1 2"}, "tokens", None),
    ],
)
async def test_malformed_bodies_are_openai_400s(
    frontend: Frontend, peer: EnginePeer, path: str, body: object, param: str | None, code: str | None
) -> None:
    """Each malformed body is a 400 naming its field, and the route keeps serving."""
    status, got = await post(frontend, body, path=path)
    assert status == 400, got
    assert_error(got, param, code)
    assert (await tokenize(frontend, {"prompt": TEXT}))[0] == 200


async def test_a_body_that_is_not_json_content_is_refused(frontend: Frontend, peer: EnginePeer) -> None:
    """As every route with a body: only application/json (vLLM's 400)."""
    async with aiohttp.ClientSession() as session:
        url = f"{frontend.url}/tokenize"
        async with session.post(url, data=b'{"prompt": "hi"}', headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 400
            assert_error(await r.json(), None, "unsupported_media_type")


@pytest.mark.parametrize(
    ("path", "body"), [("/tokenize", {"prompt": "hi"}), ("/tokenize", {"messages": MESSAGES}),
                       ("/detokenize", {"tokens": [1]})]
)  # fmt: skip
async def test_an_unknown_model_is_404(
    frontend: Frontend, peer: EnginePeer, path: str, body: dict[str, Any]
) -> None:
    """A model no engine serves is vLLM's 404, naming the model."""
    status, got = await post(frontend, {**body, "model": "gpt-4"}, path=path)
    assert status == 404
    assert_error(got, "model", "model_not_found")
    assert "gpt-4" in got["error"]["message"] and "tiny" in got["error"]["message"]


async def test_version_is_the_package_version(frontend: Frontend) -> None:
    """/version answers {"version": ...}, openinfer's version as pyproject.toml sets it; it needs no engine,
    which /tokenize does (its tokenizer comes from the engine's hello: 503 without one)."""
    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    status, text = await get(frontend, "/version")
    assert status == 200
    assert json.loads(text) == {"version": pyproject["project"]["version"]}
    assert json.loads(text)["version"] == importlib.metadata.version("openinfer")
    status, body = await tokenize(frontend, {"prompt": TEXT})
    assert status == 503 and body["error"]["code"] == "no_engine"


async def test_the_api_key_guards_the_utility_routes(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """With --api-key the three routes need it (401 without, or with a wrong one), unlike vLLM's, whose key
    guards only /v1 paths; with it they answer."""
    frontend = await start_frontend(api_key="sesame")
    await start_peer(frontend)
    for headers in [None, {"Authorization": "Bearer wrong"}]:
        status, body = await tokenize(frontend, {"prompt": TEXT}, headers)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        status, body = await detokenize(frontend, {"tokens": [1]}, headers)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert (await get(frontend, "/version", headers))[0] == 401
    key = {"Authorization": "Bearer sesame"}
    assert (await tokenize(frontend, {"prompt": TEXT}, key))[0] == 200
    assert (await detokenize(frontend, {"tokens": [1]}, key))[0] == 200
    assert (await get(frontend, "/version", key))[0] == 200
