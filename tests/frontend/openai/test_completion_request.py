"""Validation of /v1/completions bodies and their translation into engine requests."""

from __future__ import annotations

import json

import pytest

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.completion_request import CompletionRequest, parse_completion_request
from openinfer.frontend.openai.errors import ApiError
from tests.frontend import tiny_tokenizer


def parse(**fields: object) -> CompletionRequest:
    return parse_completion_request(json.dumps(fields).encode())


def make_model(max_model_len: int = 16) -> ServedModel:
    return ServedModel(
        "tiny", tiny_tokenizer.make_tokenizer(), max_model_len, vocab_size=300, eos_token_ids=(0,)
    )


def test_defaults() -> None:
    """Only a prompt given: max_tokens 16, temperature 1, no top-k, special tokens skipped, no stream."""
    options = parse_completion_request(b'{"prompt": "hi"}').options
    assert (options.max_tokens, options.temperature, options.top_p, options.top_k) == (16, 1.0, 1.0, None)
    assert options.skip_special_tokens and not options.stream and not options.return_token_ids
    assert (options.stop, options.include_stop_str_in_output, options.logprobs) == ((), False, None)


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
        ({"prompt": "a", "best_of": 3}, "best_of"),
        ({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, "stop"),  # at most 4
        ({"prompt": "a", "stop": 3}, "stop"),
        ({"prompt": "a", "stop": ["x", None]}, "stop"),
        ({"prompt": "a", "logprobs": 21}, "logprobs"),  # at most 20
        ({"prompt": "a", "logprobs": -1}, "logprobs"),
        ({"prompt": "a", "logprobs": True}, "logprobs"),  # chat's spelling
        ({"prompt": "a", "include_stop_str_in_output": 1}, "include_stop_str_in_output"),
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
    """What clients such as vLLM's benchmark send by default (n=1, logprobs null, penalty 1) passes; `user`
    and fields openinfer does not know are ignored."""
    parse(
        prompt="a", n=1, logprobs=None, repetition_penalty=1.0, echo=False, stop=[], user="me", x_new={"a": 1}
    )


def test_n_above_one_says_what_to_do() -> None:
    """n=2 is refused with a message that says only one choice is served and how to get more."""
    with pytest.raises(ApiError) as raised:
        parse(prompt="a", n=2)
    assert "one choice per request" in raised.value.message and "`n` = 1" in raised.value.message


@pytest.mark.parametrize(
    ("stop", "expected"), [(None, ()), ("", ()), ("\n", ("\n",)), (["a", "", "bc"], ("a", "bc")), ([], ())]
)
def test_stop_strings(stop: object, expected: tuple[str, ...]) -> None:
    """`stop` is a string or a list of up to 4; empty strings stop nothing and are dropped."""
    assert parse(prompt="a", stop=stop).options.stop == expected


def test_logprobs_reach_the_engine() -> None:
    """`logprobs: 3` asks the engine for 3 alternatives per token; 0 for the sampled token's alone."""
    for count in (0, 3, 20):
        request = parse(prompt=[5], logprobs=count)
        assert request.to_engine_request(make_model(), "cmpl-1").sampling_params.logprobs == count
    assert parse(prompt=[5]).to_engine_request(make_model(), "cmpl-1").sampling_params.logprobs is None


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
