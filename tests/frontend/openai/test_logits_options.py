"""Penalties, min_tokens, logit_bias, bad_words and min_p on both endpoints: OpenAI's and vLLM's ranges as
400s naming the parameter, and the engine fields they become (bad words tokenized as vLLM does)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.chat_request import parse_chat_request
from openinfer.frontend.openai.completion_request import parse_completion_request
from openinfer.frontend.openai.errors import ApiError
from openinfer.frontend.openai.logits_options import MAX_BAD_WORDS, bad_words_token_ids
from openinfer.frontend.tokenizer import Tokenizer
from openinfer.protocol import SamplingParams
from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import EnginePeer
from tests.frontend.frontends import Frontend
from tests.frontend.openai.http_calls import MESSAGES, chat, request

BUILTIN = Path(__file__).parents[3] / "engine_core" / "builtin"


def builtin_tokenizer() -> Tokenizer:
    """The built-in model's byte-level BPE: ' light' is its own tokens, as in real vocabularies."""
    return Tokenizer(
        (BUILTIN / "tokenizer.json").read_bytes(), (BUILTIN / "tokenizer_config.json").read_bytes()
    )


def engine_params(max_model_len: int = 64, **fields: Any) -> SamplingParams:
    model = ServedModel(
        "tiny", tiny_tokenizer.make_tokenizer(), max_model_len, vocab_size=300, eos_token_ids=(0,)
    )
    parsed = parse_completion_request(json.dumps({"prompt": [5, 6], **fields}).encode())
    return parsed.prepare(model, "cmpl-1").engine_request.sampling_params


BAD = [
    ({"presence_penalty": 2.5}, "presence_penalty", "must be in [-2, 2]"),
    ({"presence_penalty": "high"}, "presence_penalty", "must be a number"),
    ({"frequency_penalty": -2.01}, "frequency_penalty", "must be in [-2, 2]"),
    ({"repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
    ({"repetition_penalty": -1.5}, "repetition_penalty", "greater than 0"),
    ({"min_p": 1.5}, "min_p", "must be in [0, 1]"),
    ({"min_p": -0.1}, "min_p", "must be in [0, 1]"),
    ({"min_tokens": -1}, "min_tokens", "at least 0"),
    ({"min_tokens": 1.5}, "min_tokens", "must be an integer"),
    ({"logit_bias": {"5": 101}}, "logit_bias", "in [-100, 100]"),
    ({"logit_bias": {"5": -100.5}}, "logit_bias", "in [-100, 100]"),
    ({"logit_bias": {"five": 1}}, "logit_bias", "must be token ids"),
    ({"logit_bias": {"5": "up"}}, "logit_bias", "mapping token ids (as strings) to numbers"),
    ({"logit_bias": [5]}, "logit_bias", "mapping token ids (as strings) to numbers"),
    ({"bad_words": "fox"}, "bad_words", "a list of strings"),
    ({"bad_words": ["fox", ""]}, "bad_words", "cannot contain an empty string"),
]


@pytest.mark.parametrize(("fields", "param", "words"), BAD)
def test_bad_values_are_400_naming_the_param_on_both_endpoints(
    fields: dict[str, Any], param: str, words: str
) -> None:
    """Each out-of-range or mistyped value is a 400 invalid_request_error naming it, from completions and
    from chat alike."""
    for parse, body in (
        (parse_completion_request, {"prompt": "a", **fields}),
        (parse_chat_request, {"messages": [{"role": "user", "content": "a"}], **fields}),
    ):
        with pytest.raises(ApiError) as raised:
            parse(json.dumps(body).encode())
        assert (raised.value.status, raised.value.param) == (400, param)
        assert words in raised.value.message, raised.value.message


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens", "at most `max_tokens` (4)"),
        ({"min_tokens": 17}, "min_tokens", "at most `max_tokens` (16)"),  # completions' default bound
        ({"max_tokens": None, "min_tokens": 63}, "min_tokens", "62 tokens of output"),  # 64 - 2 prompt tokens
        ({"logit_bias": {"300": 1}}, "logit_bias", "outside the vocabulary of 300 tokens: [300]"),
        ({"logit_bias": {"-1": 1}}, "logit_bias", "outside the vocabulary"),
    ],
)
def test_bounds_that_need_the_model_are_400_too(fields: dict[str, Any], param: str, words: str) -> None:
    """min_tokens above the output bound (given, default or the room the prompt leaves) and logit_bias ids
    outside the model's vocabulary: 400s naming the parameter."""
    with pytest.raises(ApiError) as raised:
        engine_params(**fields)
    assert (raised.value.status, raised.value.param) == (400, param) and words in raised.value.message


def test_options_reach_the_engine_as_token_ids() -> None:
    """Every option is carried in SamplingParams; logit_bias keys become ints (a later duplicate wins, as
    in vLLM); nulls and absences are the neutral values."""
    params = engine_params(
        max_tokens=8, presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.2, min_tokens=3,
        logit_bias={"7": 2, "9": -100, "07": 5}, bad_words=["fox"], min_p=0.1,
    )  # fmt: skip
    fox = tiny_tokenizer.make_tokenizer().encode("fox", add_special_tokens=False)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -0.25, 1.2)
    assert (params.min_tokens, params.min_p, params.logit_bias) == (3, 0.1, {7: 5.0, 9: -100.0})
    assert params.bad_words_token_ids == [fox]
    nulls: dict[str, Any] = dict.fromkeys(["presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
                           "logit_bias", "bad_words", "min_p"])  # fmt: skip
    assert engine_params(**nulls) == engine_params() == SamplingParams(max_tokens=16)


def test_bad_words_are_tokenized_as_vllm_does() -> None:
    """Each word's tokens, then " " + word's where that is other tokens of the same length (a word barred
    after a space too); leading spaces are stripped first; a word of spaces only has no tokens (400)."""
    tokenizer = builtin_tokenizer()

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    assert len(encode("light")) == len(encode(" light")) and encode("light")[0] != encode(" light")[0]
    assert len(encode("the")) != len(encode(" the"))  # one token with its space: vLLM adds no second form
    assert bad_words_token_ids(("light", "  the"), tokenizer, 512) == [
        encode("light"),
        encode(" light"),
        encode("the"),
    ]
    with pytest.raises(ApiError) as raised:
        bad_words_token_ids(("   ",), tokenizer, 512)
    assert raised.value.param == "bad_words" and "has no tokens" in raised.value.message
    with pytest.raises(ApiError, match="at most 128"):
        bad_words_token_ids(tuple(f"w{i}" for i in range(MAX_BAD_WORDS + 1)), tokenizer, 512)
    with pytest.raises(ApiError, match="outside the model's vocabulary"):
        bad_words_token_ids(("light",), tokenizer, 100)


async def test_http_400_names_the_param_and_nothing_reaches_the_engine(
    frontend: Frontend, peer: EnginePeer
) -> None:
    """Over HTTP: a bad penalty is OpenAI's 400 body with its param; the engine never sees the request."""
    status, answer, _ = await request(
        frontend, "POST", "/v1/completions", {"prompt": "hello", "frequency_penalty": 3}
    )
    assert status == 400 and answer["error"]["param"] == "frequency_penalty"
    assert answer["error"]["type"] == "invalid_request_error"
    status, answer = await chat(frontend, {"messages": MESSAGES, "logit_bias": {"1000": 5}})
    assert status == 400 and answer["error"]["param"] == "logit_bias"
    assert not peer.requests


async def test_http_options_reach_the_engine(frontend: Frontend, peer: EnginePeer) -> None:
    """A chat request's options arrive in the engine request's SamplingParams."""
    body = {"messages": MESSAGES, "max_tokens": 4, "presence_penalty": 1, "min_tokens": 2,
            "logit_bias": {"5": 1.5}, "bad_words": ["fox"], "min_p": 0.2, "repetition_penalty": 1.1}  # fmt: skip
    status, answer = await chat(frontend, body)
    assert status == 200, answer
    [sent] = peer.requests.values()
    params = sent.sampling_params
    assert (params.presence_penalty, params.min_tokens, params.logit_bias) == (1.0, 2, {5: 1.5})
    assert (params.min_p, params.repetition_penalty, len(params.bad_words_token_ids)) == (0.2, 1.1, 1)
