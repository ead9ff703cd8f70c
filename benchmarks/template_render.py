"""What rendering a chat's template costs the frontend, in its worker process and as it was in a thread; not
a test.

    python -m openinfer.benchmarks.template_render [--renders 500]

Qwen3's chat template over a conversation with tools (4 turns, about 1,500 characters of prompt) and over a
long one (1,201 turns, about 110,000 characters), rendered ``--renders`` times one after another:

- thread: the template rendered in the default thread pool (``asyncio.to_thread``), how chats were rendered
  before issue 39: a template that loops for hours held its thread for good, one that allocates gigabytes
  did so in the frontend's memory;
- worker: :class:`~openinfer.frontend.openai.template_pool.ChatTemplatePool`, the job sent to a warm worker
  process and the prompt read back, each render bounded in time and memory.

µs per render, median and 90th percentile, as the event loop waits for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from openinfer.engine_core.testing.qwen3_checkpoint import QWEN3_CHAT_TEMPLATE
from openinfer.engine_core.testing.qwen3_tokenizer import qwen3_tokenizer_config, qwen3_tokenizer_json
from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.chat_template import compile_chat_template
from openinfer.frontend.openai.template_pool import ChatTemplatePool
from openinfer.frontend.tokenizer import Tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the weather in a city now",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CHAT = [
    {"role": "system", "content": "You are a helpful assistant. " * 10},
    {"role": "user", "content": "What is the weather in Paris? " * 5},
    {"role": "assistant", "content": "<think>\nThe user asks about Paris.\n</think>\n\nIt is sunny."},
    {"role": "user", "content": "And in Rome? Answer briefly."},
]
LONG_CHAT = CHAT[:1] + CHAT[1:] * 400  # about 110,000 characters of prompt

Render = Callable[[list[dict[str, Any]]], Awaitable[str]]


async def timed(render: Render, messages: list[dict[str, Any]], renders: int) -> list[float]:
    """Seconds per render, after a few untimed ones."""
    for _ in range(5):
        await render(messages)
    seconds = []
    for _ in range(renders):
        start = time.perf_counter()
        await render(messages)
        seconds.append(time.perf_counter() - start)
    return sorted(seconds)


async def run(renders: int) -> None:
    config = {**qwen3_tokenizer_config(), "chat_template": QWEN3_CHAT_TEMPLATE}
    tokenizer = Tokenizer(qwen3_tokenizer_json().encode(), json.dumps(config).encode())
    model = ServedModel("qwen3", tokenizer, 40960, vocab_size=151936, eos_token_ids=(151645,))
    template = compile_chat_template(QWEN3_CHAT_TEMPLATE)

    async def in_thread(messages: list[dict[str, Any]]) -> str:
        return await asyncio.to_thread(template.render, messages, tokenizer.special_tokens, True, {}, TOOLS)

    pool = ChatTemplatePool(timeout=30.0)

    async def in_worker(messages: list[dict[str, Any]]) -> str:
        return await pool.render(model, messages, True, {}, TOOLS)

    try:
        print("| conversation | prompt chars | path | median µs | p90 µs |")
        print("|---|---:|---|---:|---:|")
        for name, messages in (("4 turns, tools", CHAT), ("1,201 turns, tools", LONG_CHAT)):
            assert await in_thread(messages) == await in_worker(messages)
            chars = len(await in_thread(messages))
            for path, render in (("thread", in_thread), ("worker", in_worker)):
                seconds = await timed(render, messages, renders)
                p90 = seconds[int(len(seconds) * 0.9)]
                print(
                    f"| {name} | {chars:,} | {path} | {statistics.median(seconds) * 1e6:,.0f} | {p90 * 1e6:,.0f} |"
                )
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--renders", type=int, default=500, help="timed renders per conversation and path")
    asyncio.run(run(parser.parse_args().renders))


if __name__ == "__main__":
    main()
