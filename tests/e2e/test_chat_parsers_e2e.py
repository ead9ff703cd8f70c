"""Reasoning and tool calls end to end: openinfer-serve --reasoning-parser qwen3 --enable-auto-tool-choice
--tool-call-parser hermes, a real engine on a real-vocabulary Qwen3 checkpoint set to repeat the user's
message (engine_core/testing/echo_checkpoint.py), and the openai client, streaming and not."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion
from transformers import AutoTokenizer

from openinfer.engine_core.testing.echo_checkpoint import (
    CHAT_SUFFIX_TOKENS,
    NO_THINKING_SUFFIX_TOKENS,
    make_echo_qwen3_checkpoint,
)
from openinfer.frontend.tokenizer import Tokenizer
from tests.e2e.processes import Cluster

DISTANCE = 68
N = DISTANCE + 1 - CHAT_SUFFIX_TOKENS  # 64: the tokens of a message the model repeats
N_NO_THINKING = DISTANCE + 1 - NO_THINKING_SUFFIX_TOKENS  # 60, with enable_thinking false
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_echo_qwen3_checkpoint(tmp_path_factory.mktemp("echo") / "echo", DISTANCE)


@pytest.fixture(scope="module")
def scripts(model: Path) -> dict[str, str]:
    """What the model is made to write, each fitted to the message length it repeats."""
    tokenizer = Tokenizer((model / "tokenizer.json").read_bytes())

    def fitted(head: str, tail: str, n: int) -> str:
        """head + " ok" * k + tail, of exactly n tokens."""
        for k in range(n):
            text = head + " ok" * k + tail
            if len(tokenizer.encode(text, add_special_tokens=False)) == n:
                return text
        raise AssertionError(f"no padding makes {head!r}...{tail!r} {n} tokens")

    return {
        "reasoned": fitted("<think>\nThe user says hello", ".\n</think>\n\nHello! How can I help?", N),
        "calling": fitted("<think>\nI need the weather", ".\n</think>\n\n" + CALLS, N),
        "named": fitted(
            '{"city": "Paris', '"}', N_NO_THINKING
        ),  # get_weather's arguments: the grammar allows it
        "malformed": fitted(
            "Calling",
            '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>',
            N_NO_THINKING,
        ),  # fmt: skip
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[Cluster]:
    """openinfer-serve passes the parser flags to its frontend."""
    started = Cluster(tmp_path_factory.mktemp("logs"))
    try:
        flags = ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        started.start_serve(model, *flags)
        started.wait_healthy(timeout=120)
        yield started
    finally:
        started.stop()


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{cluster.url}/v1", api_key="-", max_retries=0, timeout=60) as c:
        yield c


async def ask(client: openai.AsyncOpenAI, text: str, **options: Any) -> ChatCompletion:
    """The answer to a user message ``text`` (which the model repeats), greedy."""
    messages: Any = [{"role": "user", "content": text}]
    return await client.chat.completions.create(model="tiny", messages=messages, temperature=0, **options)


async def ask_streamed(client: openai.AsyncOpenAI, text: str, **options: Any) -> ChatCompletion:
    """The same, streamed, accumulated as the openai client accumulates chunks."""
    messages: Any = [{"role": "user", "content": text}]
    stream = await client.chat.completions.create(
        model="tiny", messages=messages, temperature=0, stream=True, **options
    )
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    async for chunk in stream:
        state.handle_chunk(chunk)
    return state.get_final_completion()


@pytest.mark.parametrize("streamed", [False, True])
async def test_reasoning_content(client: openai.AsyncOpenAI, scripts: dict[str, str], streamed: bool) -> None:
    """The think block is message.reasoning_content, the answer its content; streamed, the deltas
    accumulate to the same message."""
    answer = await (ask_streamed if streamed else ask)(client, scripts["reasoned"])
    message = answer.choices[0].message
    thought = scripts["reasoned"].removeprefix("<think>").split("</think>")[0]
    assert getattr(message, "reasoning_content") == thought  # noqa: B009 - a vLLM extension field
    assert message.content == "\n\nHello! How can I help?"
    assert answer.choices[0].finish_reason == "stop" and not message.tool_calls


async def test_unfinished_think_block_is_reasoning(
    client: openai.AsyncOpenAI, scripts: dict[str, str]
) -> None:
    """max_tokens inside the think block: all of the output is reasoning, no content."""
    answer = await ask(client, scripts["reasoned"], max_tokens=4)
    # <think>, "\n", "The", " user"
    assert getattr(answer.choices[0].message, "reasoning_content") == "\nThe user"  # noqa: B009
    assert answer.choices[0].message.content is None and answer.choices[0].finish_reason == "length"


@pytest.mark.parametrize("streamed", [False, True])
async def test_tool_calls(client: openai.AsyncOpenAI, scripts: dict[str, str], streamed: bool) -> None:
    """Two <tool_call> blocks after the reasoning: message.tool_calls with ids, names and JSON arguments,
    finish_reason tool_calls, no content (null; "" streamed, from the role chunk, as vLLM's); streamed,
    the SDK accumulates the same calls."""
    answer = await (ask_streamed if streamed else ask)(client, scripts["calling"], tools=TOOLS)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == ("" if streamed else None)
    calls = choice.message.tool_calls or []
    assert [(c.type, c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("function", "get_weather", '{"city": "Paris"}'),
        ("function", "get_time", "{}"),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("chatcmpl-tool-") for c in calls)
    assert getattr(choice.message, "reasoning_content").startswith("\nI need the weather")  # noqa: B009


async def test_tool_choice_none_leaves_the_calls_in_content(
    client: openai.AsyncOpenAI, scripts: dict[str, str]
) -> None:
    """tool_choice "none": the tools are rendered, the output is not read for calls."""
    answer = await ask(client, scripts["calling"], tools=TOOLS, tool_choice="none")
    assert answer.choices[0].message.content == "\n\n" + CALLS and answer.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("streamed", [False, True])
async def test_named_function_reads_the_forced_form(
    client: openai.AsyncOpenAI, scripts: dict[str, str], streamed: bool
) -> None:
    """A named tool_choice and an output that is the arguments object (the form structured outputs force,
    which lets the model's own arguments through): one call to that function, finish_reason stop (OpenAI's
    for a named choice)."""
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    answer = await (ask_streamed if streamed else ask)(
        client, scripts["named"], tools=TOOLS, tool_choice=named, extra_body=NO_THINKING
    )
    [call] = answer.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert call.function.arguments == scripts["named"]  # type: ignore[union-attr]
    assert answer.choices[0].finish_reason == "stop"


async def test_malformed_tool_json_is_content(client: openai.AsyncOpenAI, scripts: dict[str, str]) -> None:
    """A <tool_call> block whose JSON does not parse is content, as the model wrote it; no 500."""
    answer = await ask(client, scripts["malformed"], tools=TOOLS, extra_body=NO_THINKING)
    assert answer.choices[0].message.content == scripts["malformed"]
    assert not answer.choices[0].message.tool_calls and answer.choices[0].finish_reason == "stop"


async def test_tool_history_is_rendered_as_transformers_renders_it(
    client: openai.AsyncOpenAI, model: Path
) -> None:
    """A conversation with an assistant's tool_calls and the tool's result: the prompt is transformers'
    apply_chat_template of the same messages and tools (Qwen3's <tools>, <tool_call>, <tool_response>)."""
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]  # fmt: skip
    answer = await client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, max_tokens=1, extra_body={"return_token_ids": True}
    )
    expected_messages = [dict(m) for m in messages]
    expected_messages[2]["tool_calls"] = [
        {**messages[2]["tool_calls"][0], "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ]  # arguments as an object, as transformers' templates take them
    hf_tokenizer = AutoTokenizer.from_pretrained(model)
    expected = hf_tokenizer.apply_chat_template(
        expected_messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert getattr(answer, "prompt_token_ids") == expected  # noqa: B009
    text = hf_tokenizer.decode(expected)
    assert "<tools>\n" in text and "<tool_call>\n{" in text and "<tool_response>\n" in text


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_news"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
async def test_bad_tools_are_400s(client: openai.AsyncOpenAI, options: dict[str, Any], param: str) -> None:
    """Malformed tools and choices raise the client's BadRequestError, with the bad part as its param."""
    with pytest.raises(openai.BadRequestError) as raised:
        await ask(client, "hi", **options)
    assert raised.value.param == param
