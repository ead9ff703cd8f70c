"""Structured outputs end to end: openinfer-serve with an n-gram drafter on a random-weight Qwen3-shaped model
with the real Qwen vocabulary, and the openai client. Whatever the weights write, the grammar makes it parse
and fit (JSON compact, the server's --structured-outputs-config, so random weights cannot drift into
whitespace); a forced tool call is certain; what does not compile is a 400."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import openai
import pydantic
import pytest
import torch
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion

from openinfer.engine_core.testing.qwen3_checkpoint import make_qwen3_0_6b_shaped_checkpoint
from tests.e2e.processes import Cluster

WIDTHS = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}},
]  # fmt: skip
GRAMMAR = 'root ::= "(" [a-z] [a-z]? ("," [a-z])? ")"'
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
PROMPTS = ["Who is Romeo?", "Give me a person as JSON.", "To be, or not to be", "x"]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    tags: list[Literal["red", "blue"]] = pydantic.Field(max_length=3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    model = make_qwen3_0_6b_shaped_checkpoint(
        tmp_path_factory.mktemp("random") / "m", widths=WIDTHS, num_shards=1, dtype=torch.float32
    )
    started = Cluster(tmp_path_factory.mktemp("logs"))
    try:
        started.start_serve(
            model, "--spec-method", "ngram", "--num-spec-tokens", "3",
            "--structured-outputs-config", '{"disable_any_whitespace": true}',
            "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        )  # fmt: skip
        started.wait_healthy(timeout=120)
        yield started
    finally:
        started.stop()


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{cluster.url}/v1", api_key="-", max_retries=0, timeout=60) as c:
        yield c


async def chat(client: openai.AsyncOpenAI, text: str, streamed: bool, **options: Any) -> ChatCompletion:
    """The answer to one user message, whole or accumulated from its stream as the SDK does."""
    messages: Any = [{"role": "user", "content": text}]
    options = {"model": "tiny", "messages": messages, "max_tokens": 200, **options}
    if not streamed:
        return await client.chat.completions.create(**options)
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    async for chunk in await client.chat.completions.create(stream=True, **options):
        state.handle_chunk(chunk)
    return state.get_final_completion()


def fits(value: Any) -> bool:
    return (
        set(value) == {"name", "age", "tags"} and len(value["name"]) <= 12 and 0 <= value["age"] <= 120
        and len(value["tags"]) <= 3 and set(value["tags"]) <= {"red", "blue"}
    )  # fmt: skip


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_json_schema_output_always_parses_and_fits(
    client: openai.AsyncOpenAI, streamed: bool, temperature: float
) -> None:
    schema_format: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    for i, prompt in enumerate(PROMPTS):
        answer = await chat(
            client, prompt, streamed, response_format=schema_format, temperature=temperature, seed=i,
            extra_body=NO_THINKING,
        )  # fmt: skip
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert fits(json.loads(choice.message.content or "", strict=False)), choice.message.content


async def test_the_sdks_parse_gets_a_pydantic_object(client: openai.AsyncOpenAI) -> None:
    messages: Any = [{"role": "user", "content": "A person, please"}]
    answer = await client.chat.completions.parse(
        model="tiny", messages=messages, response_format=Person, temperature=0, max_tokens=200,
        extra_body=NO_THINKING,
    )  # fmt: skip
    person = answer.choices[0].message.parsed
    assert isinstance(person, Person) and len(person.name) <= 12


async def test_json_object_choice_regex_and_grammar(client: openai.AsyncOpenAI) -> None:
    """Chat's json_object, and vLLM's structured_outputs on /v1/completions."""
    answer = await chat(client, "Anything as JSON", False, response_format={"type": "json_object"},
                        temperature=0, max_tokens=400, extra_body=NO_THINKING)  # fmt: skip
    if answer.choices[0].finish_reason == "stop":  # any JSON object has no bound on its length
        assert isinstance(json.loads(answer.choices[0].message.content or "", strict=False), dict)
    else:
        assert (answer.choices[0].message.content or "").startswith("{")
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"choice": ["thou art", "ROMEO", "my lord"]}, lambda t: t in ("thou art", "ROMEO", "my lord")),
        ({"regex": "[0-9]{2,4}-(yes|no)"}, lambda t: re.fullmatch("[0-9]{2,4}-(yes|no)", t)),
        ({"grammar": GRAMMAR}, lambda t: re.fullmatch(r"\([a-z]{1,2}(,[a-z])?\)", t)),
    ]  # fmt: skip
    for constraint, check in cases:
        for i, prompt in enumerate(PROMPTS):
            completion = await client.completions.create(
                model="tiny", prompt=prompt, max_tokens=40, temperature=1.0, seed=i,
                extra_body={"structured_outputs": constraint},
            )  # fmt: skip
            choice = completion.choices[0]
            assert choice.finish_reason == "stop" and check(choice.text), (constraint, choice.text)


@pytest.mark.parametrize("streamed", [False, True])
async def test_required_and_named_tool_choice_always_call(client: openai.AsyncOpenAI, streamed: bool) -> None:
    """The forced call's JSON is the grammar's: the calls parse, name offered functions and fit their
    parameters, whatever the weights."""
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    for choice_option in ("required", named):
        for i, prompt in enumerate(PROMPTS[:2]):
            answer = await chat(
                client, prompt, streamed, tools=TOOLS, tool_choice=choice_option, temperature=1.0, seed=i,
                max_tokens=300, extra_body=NO_THINKING,
            )  # fmt: skip
            choice = answer.choices[0]
            calls = choice.message.tool_calls or []
            # OpenAI's (and vLLM's) finish_reason: "tool_calls" for "required", "stop" for a named function
            assert calls and choice.finish_reason == ("tool_calls" if choice_option == "required" else "stop")
            for call in calls:
                name, arguments = call.function.name, json.loads(call.function.arguments)  # type: ignore[union-attr]
                assert name in ("get_weather", "get_time") and (
                    choice_option == "required" or name == "get_weather"
                )
                assert set(arguments) == ({"city"} if name == "get_weather" else set())


async def test_what_does_not_compile_is_a_400(client: openai.AsyncOpenAI) -> None:
    bad_schema: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    for options in (
        {"response_format": bad_schema},
        {"extra_body": {"structured_outputs": {"regex": "(unclosed"}}},
        {"extra_body": {"structured_outputs": {"choice": []}}},
        {"extra_body": {"structured_outputs": {"json": {"type": "object"}, "regex": "a"}}},
    ):
        with pytest.raises(openai.BadRequestError):
            await chat(client, "hello", False, **options)
    answer = await chat(client, "still serving", False, max_tokens=3)  # nothing else was hurt
    assert answer.choices[0].finish_reason == "length"
