"""POST /v1/chat/completions with the output parsers on: the engine peer echoes the last message, so a test
writes the model's output; reasoning_content and tool_calls streamed and whole, untouched without the
flags, tools and tool history through the template, OpenAI 400s."""

from __future__ import annotations

import json
from typing import Any

import pytest

from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.openai.http_calls import chat, chat_stream
from tests.frontend.tiny_tokenizer import tokenizer_json

ALL_ON = ChatParsers("qwen3", "hermes", enable_auto_tool_choice=True)
# The prompt is the last message and EOS: the peer echoes the message, then stops.
ECHO_TEMPLATE = "{{ messages[-1]['content'] }}{{ eos_token }}"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time"}},
]
THOUGHT = "<think>\nWeather first.\n</think>\n\n"
CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)


async def serving(
    start_frontend: FrontendFactory,
    start_peer: PeerFactory,
    parsers: ChatParsers,
    template: str = ECHO_TEMPLATE,
) -> tuple[Frontend, EnginePeer]:
    frontend = await start_frontend(chat_parsers=parsers)
    config = json.dumps({"eos_token": "<|endoftext|>", "chat_template": template}).encode()
    peer = await start_peer(frontend, PeerConfig(max_model_len=2048, tokenizer_config_json=config))
    return frontend, peer


def said(text: str, **body: Any) -> dict[str, Any]:
    """A body whose (echoed) output is ``text``."""
    return {"messages": [{"role": "user", "content": text}], **body}


def joined(chunks: list[Any], key: str) -> str:
    return "".join(c["choices"][0]["delta"].get(key, "") for c in chunks if c["choices"])


async def test_reasoning_content_whole_and_streamed(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """--reasoning-parser qwen3: the think block is reasoning_content (and vLLM's reasoning), the rest
    content; streamed as delta.reasoning_content, joining to the same texts."""
    frontend, _ = await serving(start_frontend, start_peer, ChatParsers("qwen3"))
    status, body = await chat(frontend, said(THOUGHT + "Sunny."))
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "\n\nSunny.", "reasoning_content": "\nWeather first.\n",
                       "reasoning": "\nWeather first.\n"}  # fmt: skip
    assert body["choices"][0]["finish_reason"] == "stop"
    chunks = (await chat_stream(frontend, said(THOUGHT + "Sunny.")))[:-1]
    assert joined(chunks, "reasoning_content") == joined(chunks, "reasoning") == "\nWeather first.\n"
    assert joined(chunks, "content") == "\n\nSunny."
    # max_tokens inside the block: all of it is reasoning, content null
    _, cut = await chat(frontend, said(THOUGHT + "Sunny.", max_tokens=6))
    assert cut["choices"][0]["message"]["content"] is None
    assert (
        cut["choices"][0]["finish_reason"] == "length" and cut["choices"][0]["message"]["reasoning_content"]
    )


async def test_without_flags_the_output_is_untouched(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """No parser flags: think blocks and tool-call blocks stay in content, no reasoning_content key."""
    frontend, _ = await serving(start_frontend, start_peer, ChatParsers())
    _, body = await chat(frontend, said(THOUGHT + CALLS, tools=TOOLS, tool_choice="none"))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": THOUGHT + CALLS}


async def test_tool_calls_whole_and_streamed(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Two <tool_call> blocks: message.tool_calls (ids, type, name, arguments as JSON text), content null,
    finish_reason tool_calls. Streamed: per call a delta with index, id, type, name and arguments "", then
    one with its arguments; accumulated, the same calls."""
    frontend, _ = await serving(start_frontend, start_peer, ALL_ON)
    _, body = await chat(frontend, said(THOUGHT + CALLS, tools=TOOLS))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [(c["type"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("function", "get_weather", '{"city": "Paris"}'), ("function", "get_time", "{}")]  # fmt: skip
    assert all(c["id"].startswith("chatcmpl-tool-") for c in calls) and calls[0]["id"] != calls[1]["id"]

    chunks = (await chat_stream(frontend, said(THOUGHT + CALLS, tools=TOOLS)))[:-1]
    deltas = [
        c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]
    ]
    assert [sorted(d) for d in deltas] == [["function", "id", "index", "type"], ["function", "index"]] * 2
    assert [(d["index"], d["function"]) for d in deltas] == [
        (0, {"name": "get_weather", "arguments": ""}), (0, {"arguments": '{"city": "Paris"}'}),
        (1, {"name": "get_time", "arguments": ""}), (1, {"arguments": "{}"})]  # fmt: skip
    assert joined(chunks, "reasoning_content") == "\nWeather first.\n" and joined(chunks, "content") == ""
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
async def test_malformed_tool_json_is_content(
    start_frontend: FrontendFactory, start_peer: PeerFactory, stream: bool
) -> None:
    """A block whose JSON does not parse comes back as content, as written, finish_reason stop."""
    frontend, _ = await serving(start_frontend, start_peer, ALL_ON)
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'
    body = said(bad, tools=TOOLS, chat_template_kwargs={"enable_thinking": False})
    if stream:
        chunks = (await chat_stream(frontend, body))[:-1]
        assert joined(chunks, "content") == bad and all(
            "tool_calls" not in c["choices"][0]["delta"] for c in chunks[1:]
        )
        return
    status, answer = await chat(frontend, body)
    assert status == 200 and answer["choices"][0]["message"] == {
        "role": "assistant", "content": bad, "reasoning_content": None, "reasoning": None}  # fmt: skip
    assert answer["choices"][0]["finish_reason"] == "stop"


async def test_named_and_required_choices(start_frontend: FrontendFactory, start_peer: PeerFactory) -> None:
    """A named function reads the output as its arguments (the form structured outputs will force),
    finish_reason stop as OpenAI's; "required" reads an array of calls; either falls back to <tool_call>
    blocks."""
    frontend, _ = await serving(start_frontend, start_peer, ChatParsers(tool_call_parser="hermes"))
    named = {"type": "function", "function": {"name": "get_weather"}}
    _, body = await chat(frontend, said('{"city": "Oslo"}', tools=TOOLS, tool_choice=named))
    [call] = body["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert body["choices"][0]["finish_reason"] == "stop"
    required = '[{"name": "get_time", "parameters": {}}]'
    _, body = await chat(frontend, said(required, tools=TOOLS, tool_choice="required"))
    assert [c["function"]["name"] for c in body["choices"][0]["message"]["tool_calls"]] == ["get_time"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    chunks = (await chat_stream(frontend, said(CALLS, tools=TOOLS, tool_choice="required")))[:-1]
    names = [
        d["tool_calls"][0]["function"].get("name")
        for c in chunks
        if "tool_calls" in (d := c["choices"][0]["delta"])
    ]
    assert names == ["get_weather", None, "get_time", None]


RENDER_TEMPLATE = (
    "{% if tools %}tools: {{ tools | map(attribute='function') | map(attribute='name') | join(',') }}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %} [{{ c.id }} {{ c.function.name }} city={{ c.function.arguments.city }}]"
    "{% endfor %}"
    "{% if m.tool_call_id %} (for {{ m.tool_call_id }}){% endif %}{{ '\\n' }}{% endfor %}"
)
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]  # fmt: skip


async def test_tools_and_tool_history_reach_the_template(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """The template gets `tools` as sent, an assistant's tool_calls with their arguments as objects, and
    the tool message with its tool_call_id; with tool_choice "none" the tools are still rendered."""
    frontend, peer = await serving(start_frontend, start_peer, ChatParsers(), RENDER_TEMPLATE)
    status, body = await chat(
        frontend, {"messages": HISTORY, "tools": TOOLS, "tool_choice": "none", "max_tokens": 1}
    )
    assert status == 200, body
    [request] = peer.requests.values()
    prompt = _tokenizer().decode(request.prompt_token_ids)
    assert prompt == ("tools: get_weather,get_time\nuser: Weather in Paris?\n"
                      "assistant:  [call_1 get_weather city=Paris]\ntool: sunny (for call_1)\n")  # fmt: skip


@pytest.mark.parametrize(
    ("parsers", "body", "param", "words"),
    [
        (ChatParsers(), {"tools": TOOLS}, "tool_choice", "--enable-auto-tool-choice"),
        (ALL_ON, {"tools": [{"function": {"name": "a b"}}]}, "tools[0].function.name", "pattern"),
        (ALL_ON, {"tools": TOOLS, "tool_choice": {"function": {"name": "x"}}}, "tool_choice", "not in"),
        (ALL_ON, {"tool_choice": "required"}, "tool_choice", "only allowed when 'tools'"),
        (ALL_ON, {"messages": [{"role": "tool", "content": "sunny"}]}, "messages", "tool_call_id"),
        (ALL_ON, {"messages": [{**HISTORY[1], "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]},
         "messages", "JSON text of an object"),
        (ALL_ON, {"functions": [{"name": "f"}]}, "functions", "send `tools`"),
    ],
)  # fmt: skip
async def test_bad_tool_requests_are_400s(
    start_frontend: FrontendFactory, start_peer: PeerFactory, parsers: ChatParsers, body: dict[str, Any],
    param: str, words: str,
) -> None:  # fmt: skip
    """OpenAI 400s naming the bad part; nothing reaches the engine."""
    frontend, peer = await serving(start_frontend, start_peer, parsers)
    status, answer = await chat(frontend, {"messages": [{"role": "user", "content": "hi"}], **body})
    assert status == 400 and answer["error"]["type"] == "invalid_request_error", answer
    assert answer["error"]["param"] == param and words in answer["error"]["message"], answer
    assert not peer.requests


def _tokenizer() -> Any:
    from openinfer.frontend.tokenizer import Tokenizer

    return Tokenizer(tokenizer_json())
