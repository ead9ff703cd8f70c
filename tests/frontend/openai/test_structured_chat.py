"""Structured outputs in chat and through the HTTP server: a forced tool call is its JSON constraint, which a
request's own constraint may not join; with --reasoning-parser qwen3 the constraint starts after
``</think>``; constraints reach the engine, and what does not compile is a 400 before any engine sees it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from openinfer.engine_core.testing.qwen3_tokenizer import qwen3_tokenizer_config, qwen3_tokenizer_json
from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.chat_request import ChatRequest, parse_chat_request
from openinfer.frontend.openai.chat_template import compile_chat_template
from openinfer.frontend.openai.completion_request import parse_completion_request
from openinfer.frontend.openai.errors import ApiError
from openinfer.frontend.openai.grammar_check import grammar_error
from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from openinfer.frontend.openai.structured_options import json_constraint
from openinfer.frontend.tokenizer import Tokenizer
from openinfer.protocol import EngineCoreRequest, StructuredOutputs
from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import EnginePeer
from tests.frontend.frontends import Frontend
from tests.frontend.openai.http_calls import MESSAGES, chat, post
from tests.frontend.openai.tool_specs import ALL_ON, TOOLS

THINK_END_ID = 151668  # Qwen3's </think>, one added token
# ChatML with Qwen3's generation prompt; `closed_think` writes the closed think block some templates write
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if closed_think is defined and closed_think %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
JSON_OBJECT = {"type": "json_object"}


@pytest.fixture(scope="module")
def qwen3_model() -> ServedModel:
    """A model with Qwen3's real vocabulary (``</think>`` is one token) and a ChatML template."""
    config = {**qwen3_tokenizer_config(), "chat_template": QWEN_TEMPLATE}
    tokenizer = Tokenizer(qwen3_tokenizer_json().encode(), json.dumps(config).encode())
    return ServedModel("qwen3", tokenizer, 4096, vocab_size=151936, eos_token_ids=(151645,))


def chat_body(**fields: Any) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "Weather in Paris?"}], **fields}).encode()


def prepared(request: ChatRequest, model: ServedModel) -> EngineCoreRequest:
    """``request``'s engine request for ``model``, its prompt rendered in this process (as a template worker
    renders it)."""
    assert model.tokenizer.chat_template is not None
    template = compile_chat_template(model.tokenizer.chat_template)
    prompt = template.render(
        request.messages,
        model.tokenizer.special_tokens,
        request.add_generation_prompt,
        request.template_kwargs,
        request.tools.tools,
    )
    return request.prepare(model, "chatcmpl-1", prompt).engine_request


@pytest.mark.parametrize(
    "choice",
    [
        "required",
        {"type": "function", "function": {"name": "get_weather"}},
        {"function": {"name": "get_time"}},
    ],
)
@pytest.mark.parametrize("parallel", [None, False])
def test_forced_tool_choice_is_the_json_constraint_of_its_schema(
    choice: object, parallel: bool | None
) -> None:
    """ "required" and a named function constrain the output to ChatTools.output_schema(), so the call is
    certain; a 400 about it names `tools`; xgrammar compiles it."""
    parsed = parse_chat_request(
        chat_body(tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel), ALL_ON
    )
    schema = parsed.tools.output_schema()
    constraint = parsed.options.structured
    assert schema is not None and constraint is not None
    assert constraint == json_constraint(schema, "tools")
    assert constraint.outputs == StructuredOutputs("json", json.dumps(schema, separators=(",", ":")))
    pytest.importorskip("xgrammar")
    assert grammar_error(constraint.outputs) is None


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_unforced_tool_choices_leave_the_request_constraint(choice: str) -> None:
    """ "auto" and "none" constrain nothing; a response_format with them is the request's constraint."""
    assert parse_chat_request(chat_body(tools=TOOLS, tool_choice=choice), ALL_ON).options.structured is None
    with_format = parse_chat_request(
        chat_body(tools=TOOLS, tool_choice=choice, response_format=JSON_OBJECT), ALL_ON
    )
    assert with_format.options.structured is not None
    assert with_format.options.structured.outputs == StructuredOutputs("json_object", "")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"function": {"name": "get_time"}}, "response_format": JSON_OBJECT}, "response_format"),
        ({"tool_choice": "required", "response_format": {"type": "json_schema", "json_schema": {
            "name": "w", "schema": {"type": "object"}}}}, "response_format"),
        ({"tool_choice": "required", "structured_outputs": {"regex": "a+"}}, "structured_outputs"),
        ({"tool_choice": {"function": {"name": "get_time"}}, "structured_outputs": {"choice": ["a"]}},
         "structured_outputs"),
    ],
)  # fmt: skip
def test_forced_tool_choice_with_a_constraint_is_400(fields: dict[str, Any], param: str) -> None:
    """A forced call and a constraint of the request's own cannot both hold: vLLM's 400, naming the
    constraint's field; a text response_format is no constraint."""
    with pytest.raises(ApiError) as raised:
        parse_chat_request(chat_body(tools=TOOLS, **fields), ALL_ON)
    assert raised.value.status == 400 and raised.value.param == param
    assert (
        "You can only either use constraints for structured outputs or tools, not both"
        in raised.value.message
    )
    text = parse_chat_request(
        chat_body(tools=TOOLS, tool_choice="required", response_format={"type": "text"}), ALL_ON
    )
    assert text.options.structured is not None and text.options.structured.param == "tools"


@pytest.mark.parametrize(
    ("parsers", "template_kwargs", "start_after"),
    [
        (ChatParsers("qwen3"), {}, THINK_END_ID),  # Qwen3 thinks first: the grammar applies after </think>
        (ChatParsers("qwen3"), {"enable_thinking": True}, THINK_END_ID),
        (ChatParsers("qwen3"), {"enable_thinking": False}, None),  # no reasoning: from the first token
        (ChatParsers("qwen3"), {"closed_think": True}, None),  # the prompt closed the think block
        (ChatParsers(), {}, None),  # no reasoning parser: the output is all content
    ],
)
def test_reasoning_defers_the_constraint_to_the_think_end_token(
    qwen3_model: ServedModel, parsers: ChatParsers, template_kwargs: dict[str, Any], start_after: int | None
) -> None:
    """--reasoning-parser qwen3 with thinking on: the constraint starts after </think>'s token id (as
    vLLM applies it once reasoning ends); otherwise from the first output token."""
    body = chat_body(response_format=JSON_OBJECT, chat_template_kwargs=template_kwargs)
    request = prepared(parse_chat_request(body, parsers), qwen3_model)
    expected = StructuredOutputs("json_object", "", start_after_token_id=start_after)
    assert request.sampling_params.structured_outputs == expected


def test_forced_calls_after_reasoning_and_no_constraint_without_one(qwen3_model: ServedModel) -> None:
    """A forced call's constraint also starts after </think>; a request without a constraint has none."""
    parsers = ChatParsers("qwen3", "hermes")
    forced = parse_chat_request(chat_body(tools=TOOLS, tool_choice="required"), parsers)
    outputs = prepared(forced, qwen3_model).sampling_params.structured_outputs
    assert outputs is not None and (outputs.kind, outputs.start_after_token_id) == ("json", THINK_END_ID)
    free = prepared(parse_chat_request(chat_body(), parsers), qwen3_model)
    assert free.sampling_params.structured_outputs is None


def test_no_start_token_where_think_end_is_several_tokens_or_for_completions(
    qwen3_model: ServedModel,
) -> None:
    """The tiny vocabulary spells </think> in several tokens: no start token (the grammar from the first
    token); completions have no reasoning parser, so none either."""
    tiny = ServedModel("tiny", tiny_tokenizer.make_tokenizer(), 256, vocab_size=300, eos_token_ids=(0,))
    chat_request = parse_chat_request(chat_body(response_format=JSON_OBJECT), ChatParsers("qwen3"))
    outputs = prepared(chat_request, tiny).sampling_params.structured_outputs
    assert outputs == StructuredOutputs("json_object", "", start_after_token_id=None)
    completion = parse_completion_request(
        json.dumps({"prompt": "a", "response_format": JSON_OBJECT}).encode()
    )
    outputs = completion.prepare(qwen3_model, "cmpl-1").engine_request.sampling_params.structured_outputs
    assert outputs == StructuredOutputs("json_object", "")


async def test_constraints_reach_the_engine(frontend: Frontend, peer: EnginePeer) -> None:
    """Both endpoints send the constraint in the engine request's sampling params."""
    choice = {"structured_outputs": {"choice": ["yes", "no"], "disable_any_whitespace": True}}
    status, body = await post(frontend, {"prompt": "hello", "max_tokens": 2, **choice})
    assert status == 200, body
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    status, body = await chat(frontend, {"messages": MESSAGES, "max_tokens": 2, "response_format": rf})
    assert status == 200, body
    sent = [r.sampling_params.structured_outputs for r in peer.requests.values()]
    assert sent == [
        StructuredOutputs("choice", '["yes","no"]', any_whitespace=False),
        StructuredOutputs("json", '{"type":"object","properties":{"ok":{"type":"boolean"}}}'),
    ]


async def test_what_does_not_compile_is_400_before_the_engine(frontend: Frontend, peer: EnginePeer) -> None:
    """With xgrammar in the frontend, a regex or schema it cannot compile is a 400 naming its field, and
    no engine is sent the request."""
    pytest.importorskip("xgrammar")
    status, body = await post(frontend, {"prompt": "hello", "structured_outputs": {"regex": "(ab"}})
    assert status == 400 and body["error"]["param"] == "structured_outputs", body
    assert body["error"]["message"].startswith("the regex does not compile: Regex parsing error")
    bad_schema = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "objekt"}}}
    status, body = await chat(frontend, {"messages": MESSAGES, "response_format": bad_schema})
    assert status == 400 and body["error"]["param"] == "response_format", body
    assert body["error"]["message"] == 'the JSON schema does not compile: Unsupported type "objekt"'
    assert not peer.requests
