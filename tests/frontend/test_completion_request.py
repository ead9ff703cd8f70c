"""Validation of /v1/completions bodies and their translation into engine requests."""

from __future__ import annotations

import json

import pytest

from openinfer.frontend.api_error import ApiError
from openinfer.frontend.completion_request import CompletionRequest, parse_completion_request
from openinfer.frontend.engine_registry import ServedModel
from tests.frontend import tiny_tokenizer


def parse(**fields: object) -> CompletionRequest:
    return parse_completion_request(json.dumps(fields).encode())


def make_model(max_model_len: int = 16) -> ServedModel:
    return ServedModel(
        "tiny", tiny_tokenizer.make_tokenizer(), max_model_len, vocab_size=300, eos_token_ids=(0,)
    )


def test_defaults() -> None:
    """Only a prompt given: max_tokens 16, temperature 1, no top-k, special tokens skipped, no stream."""
    request = parse_completion_request(b'{"prompt": "hi"}')
    assert (request.max_tokens, request.temperature, request.top_p, request.top_k) == (16, 1.0, 1.0, None)
    assert request.skip_special_tokens and not request.stream and not request.return_token_ids


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("hi", "hi"), ([5, 6], [5, 6]), (["hi"], "hi"), ([[5, 6]], [5, 6])],
)
def test_prompt_forms(prompt: object, expected: object) -> None:
    """A prompt is a string, token ids, or a one-element list of either."""
    assert parse(prompt=prompt).prompt == expected


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [1, True]}, "prompt"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "a", "max_tokens": "3"}, "max_tokens"),
        ({"prompt": "a", "temperature": -1}, "temperature"),
        ({"prompt": "a", "top_p": 0}, "top_p"),
        ({"prompt": "a", "top_k": -2}, "top_k"),
        ({"prompt": "a", "stream": "yes"}, "stream"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "a", "n": 2}, "n"),
        ({"prompt": "a", "stop": ["x"]}, "stop"),
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "model": 3}, "model"),
    ],
)
def test_bad_fields_are_400_naming_the_param(fields: dict[str, object], param: str) -> None:
    """Each bad or unsupported parameter is a 400 invalid_request_error naming that parameter."""
    with pytest.raises(ApiError) as raised:
        parse(**fields)
    assert (raised.value.status, raised.value.type, raised.value.param) == (
        400,
        "invalid_request_error",
        param,
    )


def test_neutral_values_of_unsupported_params_are_accepted() -> None:
    """What clients such as vLLM's benchmark send by default (n=1, logprobs null, penalty 1) passes."""
    parse(prompt="a", n=1, logprobs=None, repetition_penalty=1.0, echo=False, stop=[], user="me")


@pytest.mark.parametrize("body", [b"{", b"[1]", b"\xff"])
def test_body_that_is_not_a_json_object_is_400(body: bytes) -> None:
    """Invalid JSON, or JSON that is not an object, is a 400."""
    with pytest.raises(ApiError) as raised:
        parse_completion_request(body)
    assert raised.value.status == 400


def test_engine_request_carries_the_sampling_params() -> None:
    """Sampling fields reach SamplingParams as given; top_k 0 means off; EOS is not added to stop ids."""
    request = parse(prompt=[5, 6], max_tokens=3, temperature=0, top_p=0.5, top_k=0, seed=7,
                    stop_token_ids=[9], ignore_eos=True)  # fmt: skip
    engine_request = request.to_engine_request(make_model(), "cmpl-1")
    params = engine_request.sampling_params
    assert engine_request.prompt_token_ids == [5, 6]
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed) == (
        3,
        0.0,
        0.5,
        None,
        7,
    )
    assert (params.stop_token_ids, params.ignore_eos) == ([9], True)


def test_max_tokens_is_capped_by_the_model_length() -> None:
    """Prompt + output never exceed max_model_len: 16 - 10 prompt tokens leaves 6."""
    request = parse(prompt=list(range(2, 12)), max_tokens=100)
    engine_request = request.to_engine_request(make_model(max_model_len=16), "cmpl-1")
    assert engine_request.sampling_params.max_tokens == 6


@pytest.mark.parametrize(("prompt_len", "vocab_id"), [(16, 5), (2, 300)])
def test_prompt_filling_the_model_or_out_of_vocabulary_is_400(prompt_len: int, vocab_id: int) -> None:
    """A prompt of max_model_len tokens leaves no room (400); so is a token id >= vocab_size."""
    request = parse(prompt=[5] * (prompt_len - 1) + [vocab_id])
    with pytest.raises(ApiError) as raised:
        request.to_engine_request(make_model(max_model_len=16), "cmpl-1")
    assert (raised.value.status, raised.value.param) == (400, "prompt")
