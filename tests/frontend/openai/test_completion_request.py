"""Validation of /v1/completions bodies and their translation into engine requests."""

from __future__ import annotations

import copy
import dataclasses
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


def _untokenizable(model: ServedModel) -> ServedModel:
    """``model`` with a tokenizer that fails the test if it is asked to encode anything."""
    tokenizer = copy.copy(model.tokenizer)

    def encode(text: str, add_special_tokens: bool = True) -> list[int]:
        raise AssertionError("the prompt was tokenized")

    tokenizer.encode = encode  # type: ignore[method-assign]
    return dataclasses.replace(model, tokenizer=tokenizer)


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
        ({"prompt": "a", "n": 0}, "n"),
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


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"max_tokens": 1.0}, "max_tokens", "`max_tokens` must be an integer"),  # a float, even a whole one
        ({"max_tokens": True}, "max_tokens", "`max_tokens` must be an integer"),  # a bool is no integer
        ({"temperature": "0.5"}, "temperature", "`temperature` must be a number"),
        ({"top_k": 2.5}, "top_k", "`top_k` must be an integer"),
        ({"seed": "7"}, "seed", "`seed` must be an integer"),
        ({"ignore_eos": 1}, "ignore_eos", "`ignore_eos` must be true or false"),
        ({"model": ["tiny"]}, "model", "`model` must be a string"),
        # nested values are blamed on their top-level field
        ({"stream": True, "stream_options": 1}, "stream_options", "`stream_options` must be an object"),
        (
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options",
            "`stream_options.include_usage` must be true or false",
        ),
        ({"stop": ["x", 3]}, "stop", "`stop` must be a string or a list of strings"),
        ({"stop_token_ids": [1, -1]}, "stop_token_ids", "a list of non-negative integer token ids"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids", "a list of non-negative integer token ids"),
        ({"logprobs": "3"}, "logprobs", "the number of alternatives per token, in [0, 20]"),
    ],
)
def test_wrong_types_are_400_naming_the_field(fields: dict[str, object], param: str, message: str) -> None:
    """A value of the wrong JSON type is a 400 whose param is the top-level field and whose message says
    what the field must be."""
    with pytest.raises(ApiError) as raised:
        parse(prompt="a", **fields)
    assert (raised.value.status, raised.value.type, raised.value.param) == (
        400,
        "invalid_request_error",
        param,
    )
    assert message in raised.value.message


@pytest.mark.parametrize("prompt", [[[1, -1]], [[1, "a"]], [1, "a"], [1, [2]], [1.5], {"text": "a"}, 3])
def test_malformed_prompts_say_what_a_prompt_is(prompt: object) -> None:
    """A prompt that is none of its forms (nested or mixed) is a 400 listing the forms."""
    with pytest.raises(ApiError) as raised:
        parse(prompt=prompt)
    assert (
        raised.value.param == "prompt" and "a list of non-negative integer token ids" in raised.value.message
    )


def test_null_fields_mean_their_defaults() -> None:
    """null is as good as absent for every field with a default; max_tokens null lifts the 16-token default
    (as many as the model length leaves), as it does in vLLM."""
    nulls = dict.fromkeys(
        ["temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "include_stop_str_in_output",
         "ignore_eos", "skip_special_tokens", "return_token_ids", "logprobs", "stream", "stream_options",
         "model", "n", "echo", "suffix"]
    )  # fmt: skip
    request = parse(prompt="a", **nulls)
    assert request.model is None
    assert request.options == parse(prompt="a").options
    unbounded = parse(prompt=[5], max_tokens=None).prepare(make_model(), "cmpl-1").engine_request
    assert unbounded.sampling_params.max_tokens == 15  # max_model_len 16 - 1 prompt token


def test_integers_are_numbers() -> None:
    """A JSON integer is a number: temperature 0 and top_p 1 are floats 0.0 and 1.0."""
    options = parse(prompt="a", temperature=0, top_p=1).options
    assert (options.temperature, options.top_p) == (0.0, 1.0) and isinstance(options.temperature, float)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"prompt": "a", "max_tokens": "x", ', "not valid JSON"),  # truncated after a wrong type
        (b'{"prompt": "a", "temperature": 1e400}', "not valid JSON"),  # past a float's range
        (b'["a"]', "must be a JSON object"),
    ],
)
def test_body_errors_keep_their_messages(body: bytes, message: str) -> None:
    """A body that is not JSON says so even where a wrong type comes before the syntax error; a body that is
    not an object says that."""
    with pytest.raises(ApiError) as raised:
        parse_completion_request(body)
    assert (raised.value.status, raised.value.param) == (400, None) and message in raised.value.message


def test_neutral_values_of_unsupported_params_are_accepted() -> None:
    """What clients such as vLLM's benchmark send by default (n=1, logprobs null, penalty 1) passes; `user`
    and fields openinfer does not know are ignored: the request is the one a bare prompt makes."""
    neutral = parse(
        prompt="a", n=1, logprobs=None, repetition_penalty=1.0, echo=False, stop=[], user="me", x_new={"a": 1}
    )
    assert neutral == parse(prompt="a")


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
        assert request.prepare(make_model(), "cmpl-1").engine_request.sampling_params.logprobs == count
    assert parse(prompt=[5]).prepare(make_model(), "cmpl-1").engine_request.sampling_params.logprobs is None


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
    engine_request = request.prepare(make_model(), "cmpl-1").engine_request
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


def test_max_tokens_is_cut_to_the_room_the_prompt_leaves() -> None:
    """Prompt + output never exceed max_model_len: 16 - 10 prompt tokens leaves 6 of the 16 asked (vLLM
    cuts a bound within the context, as its get_max_tokens does)."""
    request = parse(prompt=list(range(2, 12)), max_tokens=16)
    engine_request = request.prepare(make_model(max_model_len=16), "cmpl-1").engine_request
    assert engine_request.sampling_params.max_tokens == 6


def test_max_tokens_past_the_context_is_400_in_vllms_words() -> None:
    """max_tokens 17 on a 16-token model: vLLM's TokenizeParams message, naming the field."""
    request = parse(prompt=[5], max_tokens=17)
    with pytest.raises(ApiError) as raised:
        request.prepare(make_model(max_model_len=16), "cmpl-1")
    assert (raised.value.status, raised.value.param) == (400, "max_tokens")
    assert raised.value.message == (
        "max_tokens=17 cannot be greater than max_model_len=16. Please request fewer output tokens."
    )


@pytest.mark.parametrize(
    ("prompt_len", "words"),
    [
        (17, "your prompt contains 17 input tokens, which exceeds this limit even without any output tokens"),
        (16, "your prompt contains 16 input tokens, which leaves no room for output tokens (at least 1)"),
    ],
)
def test_prompt_past_or_filling_the_context_is_400(prompt_len: int, words: str) -> None:
    """vLLM's words for a prompt the context cannot hold, and for one that leaves no room for output."""
    request = parse(prompt=[5] * prompt_len)
    with pytest.raises(ApiError) as raised:
        request.prepare(make_model(max_model_len=16), "cmpl-1")
    assert raised.value.message.startswith("This model's maximum context length is 16 tokens. However, ")
    assert words in raised.value.message and raised.value.param == "prompt"


def test_text_too_long_for_any_tokens_is_400_before_tokenizing() -> None:
    """More characters than 16 tokens of the tiny tokenizer's longest piece could spell: vLLM's 400, without
    tokenizing (a tokenizer that would fail proves it); exactly that many are tokenized."""
    model = make_model(max_model_len=16)
    bound = 16 * model.tokenizer.max_chars_per_token
    with pytest.raises(ApiError) as raised:
        parse(prompt="a" * (bound + 1)).prepare(_untokenizable(model), "cmpl-1")
    assert raised.value.message == (
        f"This model's maximum context length is 16 tokens. However, your prompt contains {bound + 1} "
        f"characters (more than {bound} characters, which is the upper bound for 16 input tokens). Please "
        "reduce the length of the input prompt."
    )
    with pytest.raises(ApiError) as tokenized:  # within the bound: tokenized, then too many tokens
        parse(prompt="a " * (bound // 2)).prepare(model, "cmpl-1")
    assert "input tokens" in tokenized.value.message


@pytest.mark.parametrize(("prompt_len", "vocab_id"), [(16, 5), (2, 300)])
def test_prompt_filling_the_model_or_out_of_vocabulary_is_400(prompt_len: int, vocab_id: int) -> None:
    """A prompt of max_model_len tokens leaves no room (400); so is a token id >= vocab_size."""
    request = parse(prompt=[5] * (prompt_len - 1) + [vocab_id])
    with pytest.raises(ApiError) as raised:
        request.prepare(make_model(max_model_len=16), "cmpl-1")
    assert (raised.value.status, raised.value.param) == (400, "prompt")
