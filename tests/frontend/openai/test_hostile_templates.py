"""A model's chat template is code from its files (issue 39): one that loops for hours or allocates gigabytes
renders in a worker process that is killed at the deadline, or refused the memory, so its request is a 500 in
bounded time while /health and other requests are answered, and the worker's slot is filled again. Sound
templates render in a worker exactly as in the frontend's own process. Real worker processes, over real HTTP."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from openinfer.benchmarks.health_during_prompt import post_while_polling_health
from openinfer.engine_core.testing.qwen3_checkpoint import QWEN3_CHAT_TEMPLATE
from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.api_server import CHAT_TEMPLATES
from openinfer.frontend.openai.chat_template import compile_chat_template
from openinfer.frontend.openai.template_pool import ChatTemplatePool
from openinfer.frontend.tokenizer import Tokenizer
from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.openai.chat_templates import CONVERSATIONS, QWEN_STYLE
from tests.frontend.openai.http_calls import get, post
from tests.frontend.openai.tool_specs import TOOLS
from tests.frontend.waits import alive, wait_until

# 99,999 is under jinja2's sandbox bound on a range (100,000), and the two loops turn 10^10 times: hours.
NESTED_LOOPS = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x"
HUGE_STRING = "{{ 'x' * 8000000000 }}"  # 8 GB
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
_WAIT_S = 60.0  # a worker's start (a Python process importing jinja2) and an answer, on a loaded machine


def hostile_peer(template: str) -> PeerConfig:
    """An engine whose model ships ``template`` in its tokenizer_config.json."""
    config = {"eos_token": "<|endoftext|>", "chat_template": template}
    return PeerConfig(tokenizer_config_json=json.dumps(config).encode())


def pool(frontend: Frontend) -> ChatTemplatePool:
    return frontend.runner.app[CHAT_TEMPLATES]


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", CHAT), ("/tokenize", {"messages": CHAT["messages"]})],
)
async def test_a_template_past_the_deadline_is_a_500_and_its_worker_is_replaced(
    start_frontend: FrontendFactory, start_peer: PeerFactory, path: str, body: dict[str, Any]
) -> None:
    """Nested range loops with a 1 s deadline: a 500 naming the flag, for chat and for /tokenize's chat form,
    with /health answering 200 all along; the worker that rendered is killed and the warm one started with
    the server is replaced; nothing reaches the engine."""
    frontend = await start_frontend(chat_template_timeout=1.0)
    peer = await start_peer(frontend, hostile_peer(NESTED_LOOPS))
    await wait_until(lambda: len(pool(frontend).worker_pids) == 1, _WAIT_S)  # warm before the first chat
    [warm] = pool(frontend).worker_pids
    answer = post_while_polling_health(frontend.url, path, body, 0.02)  # raises on a /health but 200
    status, got, _, _ = await asyncio.wait_for(answer, _WAIT_S)
    assert status == 500 and got["error"]["code"] == "chat_template_timeout"
    assert got["error"]["message"].startswith(
        "the chat template took more than 1 s to render these messages (the server's --chat-template-timeout)"
    )
    await wait_until(lambda: not alive(warm), _WAIT_S)
    await wait_until(lambda: len(pool(frontend).worker_pids) == 1, _WAIT_S)
    assert warm not in pool(frontend).worker_pids and peer.requests == {}


async def test_requests_are_served_while_a_template_hangs_and_a_client_that_leaves_has_its_worker_killed(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """A render that would run for hours (a 600 s deadline): /health and a completion are answered while it
    runs; closing its connection kills its worker (a thread could not be stopped), and a warm one is kept."""
    frontend = await start_frontend(chat_template_timeout=600.0)
    await start_peer(frontend, hostile_peer(NESTED_LOOPS))
    chat = asyncio.create_task(post(frontend, CHAT, path="/v1/chat/completions"))
    await wait_until(lambda: bool(pool(frontend).busy_pids), _WAIT_S)
    [hung] = pool(frontend).busy_pids
    assert (await get(frontend, "/health"))[0] == 200
    status, got = await post(frontend, {"prompt": "hi", "max_tokens": 2})
    assert status == 200 and got["choices"][0]["finish_reason"] == "length"
    assert not chat.done() and pool(frontend).busy_pids == [hung]
    chat.cancel()  # the client's session closes the connection
    await asyncio.gather(chat, return_exceptions=True)
    await wait_until(lambda: not alive(hung), _WAIT_S)
    await wait_until(lambda: len(pool(frontend).worker_pids) == 1, _WAIT_S)
    assert pool(frontend).busy_pids == []


async def test_a_template_that_allocates_gigabytes_is_a_500_from_the_worker_memory_bound(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """8 GB of string: the worker's allocation fails at its address-space bound (1 GiB), never in the
    frontend's process: a 500 saying so, /health answering 200 all along; the worker answered, so it serves
    the next render."""
    frontend = await start_frontend()
    await start_peer(frontend, hostile_peer(HUGE_STRING))
    answer = post_while_polling_health(frontend.url, "/v1/chat/completions", CHAT, 0.02)
    status, got, _, _ = await asyncio.wait_for(answer, _WAIT_S)
    assert status == 500 and got["error"]["message"].startswith(
        "the chat template needed more than 1024 MiB to render these messages; fix the model's chat template"
    )
    await wait_until(lambda: len(pool(frontend).worker_pids) == 2, _WAIT_S)  # it, and the one started then
    workers = pool(frontend).worker_pids
    status, _ = await post(frontend, CHAT, path="/v1/chat/completions")
    assert status == 500 and pool(frontend).worker_pids == workers


@pytest.mark.parametrize(
    ("template", "messages", "tools"),
    [
        *[(QWEN_STYLE, messages, None) for messages in CONVERSATIONS],
        (QWEN3_CHAT_TEMPLATE, CONVERSATIONS[1], TOOLS),
    ],
)
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
async def test_a_worker_renders_what_the_frontend_process_renders(
    template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]
) -> None:
    """Messages, tools and template kwargs cross to the worker as JSON, as they came: the prompt is the text
    the template renders in this process, character for character (non-ASCII, tojson of nested fields)."""
    config = {"eos_token": "<|endoftext|>", "chat_template": template}
    tokenizer = Tokenizer(tiny_tokenizer.tokenizer_json(), json.dumps(config).encode())
    model = ServedModel("tiny", tokenizer, 4096, vocab_size=300, eos_token_ids=(0,))
    templates = ChatTemplatePool(timeout=_WAIT_S)
    try:
        rendered = await templates.render(model, messages, True, kwargs, tools)
    finally:
        await templates.close()
    here = compile_chat_template(template).render(messages, tokenizer.special_tokens, True, kwargs, tools)
    assert rendered == here
