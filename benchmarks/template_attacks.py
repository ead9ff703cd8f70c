"""Issue 39's hostile chat template (item 8): a model whose own chat template turns hostile on some messages.

A request cannot bring a template (a per-request ``chat_template`` is a 400), so the attack serves a copy of
the built-in model whose template renders as the built-in one does, except for a message holding ``LOOP``
(nested ``range(99999)`` loops: hours of rendering) or ``BIG`` (``'x' * 8000000000``: 8 GB). The attacker
sends such chats two at a time for about ``Target.seconds``; the victim's own chats and completions, and
``/health``, must go on as before, and each hostile chat must end with an error in bounded time
(``--chat-template-timeout``, 5 s by default).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from openinfer.benchmarks.attack_target import Target, tally
from openinfer.engine_core.builtin_model import builtin_target_folder

# Rendered before the model's own template: nothing for an ordinary conversation.
HOSTILE_PREFIX = (
    "{%- if 'LOOP' in messages[-1]['content'] %}{%- for i in range(99999) %}{%- for j in range(99999) %}"
    "{%- endfor %}{%- endfor %}{%- endif %}"
    "{%- if 'BIG' in messages[-1]['content'] %}{{ 'x' * 8000000000 }}{%- endif %}"
)
CHAT_TIMEOUT_S = 60.0  # a hostile chat not answered in this long is a hang


def hostile_model(folder: Path) -> list[str]:
    """Copy the built-in model into ``folder`` with the hostile template; the serve flags that serve it."""
    model = Path(shutil.copytree(builtin_target_folder(), folder / "hostile-template-model"))
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = HOSTILE_PREFIX + config["chat_template"]
    config_path.write_text(json.dumps(config))
    return ["--model", str(model)]


def _triggers() -> Iterator[str]:
    while True:
        yield "LOOP"
        yield "BIG"


async def _chat(target: Target, session: aiohttp.ClientSession, trigger: str) -> tuple[int, float]:
    """One hostile chat: its status (0: none within CHAT_TIMEOUT_S) and how long it took."""
    body = {"model": target.model, "messages": [{"role": "user", "content": trigger}], "max_tokens": 2}
    started = time.monotonic()
    try:
        async with session.post(
            f"{target.url}/v1/chat/completions",
            json=body,
            timeout=aiohttp.ClientTimeout(total=CHAT_TIMEOUT_S),
        ) as r:
            await r.read()
            return r.status, time.monotonic() - started
    except (TimeoutError, aiohttp.ClientError):
        return 0, time.monotonic() - started


async def hostile_templates(target: Target) -> str:
    """Hostile chats two at a time (LOOP, then BIG, in turn) until ``target.seconds`` passed."""
    statuses: dict[str, list[int]] = {"LOOP": [], "BIG": []}
    slowest = 0.0
    deadline = time.monotonic() + target.seconds
    triggers = _triggers()
    while time.monotonic() < deadline:
        pair = [next(triggers), next(triggers)]
        results = await asyncio.gather(*(_chat(target, target.session, t) for t in pair))
        for trigger, (status, seconds) in zip(pair, results, strict=True):
            statuses[trigger].append(status)
            slowest = max(slowest, seconds)
    loops, bigs = tally(statuses["LOOP"]), tally(statuses["BIG"])
    return f"nested range(99999) loops: {loops}; 'x' * 8e9: {bigs}; the slowest answered in {slowest:.1f} s"
