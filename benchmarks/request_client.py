"""One streamed request to an OpenAI-compatible server, timed from real timestamps.

TTFT is the time from just before the POST to the first chunk carrying text; each later chunk with text adds
one inter-token latency (ITL: the gap since the previous one; a chunk may carry several tokens, e.g. an
accepted draft, as vLLM's benchmark counts it); E2E is the time to ``data: [DONE]``. Output and prompt tokens
come from the final usage chunk (``stream_options.include_usage``), else the number of chunks with text and
the bench tokenizer's count; prompt tokens the server's prefix cache held, from its
``usage.prompt_tokens_details.cached_tokens`` when it reports them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from openinfer.benchmarks.datasets import SampledRequest

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class SamplingConfig:
    """What every request asks for besides its prompt and length."""

    model: str
    endpoint: str  # a key of ENDPOINTS
    temperature: float
    ignore_eos: bool


@dataclass(frozen=True)
class RequestOutcome:
    """One request's timings in seconds, or why it failed (``error`` None: it succeeded)."""

    prompt_len: int
    output_tokens: int = 0
    ttft: float | None = None
    e2e: float | None = None
    itl: tuple[float, ...] = ()  # gaps between successive chunks with text
    error: str | None = None
    output_text: str = ""  # the reply, as streamed (a conversation's next turn carries it)
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens; None: not reported

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None with fewer than two tokens."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def request_body(request: SampledRequest, sampling: SamplingConfig) -> dict[str, Any]:
    """The JSON body of one streamed request (vLLM's ``ignore_eos`` only when asked for)."""
    body: dict[str, Any] = {
        "model": sampling.model,
        "temperature": sampling.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if sampling.endpoint == "chat":
        messages = [*request.history, request.prompt]  # user first, then in turn
        body["messages"] = [
            {"role": "assistant" if i % 2 else "user", "content": text} for i, text in enumerate(messages)
        ]
        body["max_completion_tokens"] = request.max_tokens
    else:
        body["prompt"] = "".join(request.history) + request.prompt
        body["max_tokens"] = request.max_tokens
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    return body


async def send_request(
    session: aiohttp.ClientSession, base_url: str, request: SampledRequest, sampling: SamplingConfig
) -> RequestOutcome:
    """Send one streamed request and time it; any failure is returned in ``error``, never raised."""
    url = base_url + ENDPOINTS[sampling.endpoint]
    start = time.perf_counter()
    last: float | None = None  # time of the latest chunk with text
    ttft: float | None = None
    itl: list[float] = []
    texts: list[str] = []  # each chunk's text, in order
    usage_tokens: int | None = None
    usage_prompt: int | None = None
    cached_tokens: int | None = None
    done = False
    try:
        async with session.post(url, json=request_body(request, sampling)) as response:
            if response.status != 200:
                body = (await response.text())[:300]
                return RequestOutcome(request.prompt_len, error=f"HTTP {response.status}: {body}")
            async for raw_line in response.content:  # server-sent events, one `data: ...` line each
                line = raw_line.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue  # blank separators, `:` comments, `event:` lines
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return RequestOutcome(request.prompt_len, error=f"stream error: {chunk['error']}")
                text = "".join(_chunk_text(choice) for choice in chunk.get("choices") or [])
                if text:
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - start
                    elif last is not None:
                        itl.append(now - last)
                    last = now
                    texts.append(text)
                usage = chunk.get("usage") or {}
                if usage.get("completion_tokens") is not None:
                    usage_tokens = int(usage["completion_tokens"])
                if usage.get("prompt_tokens") is not None:
                    usage_prompt = int(usage["prompt_tokens"])
                if (usage.get("prompt_tokens_details") or {}).get("cached_tokens") is not None:
                    cached_tokens = int(usage["prompt_tokens_details"]["cached_tokens"])
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError, UnicodeDecodeError) as e:
        return RequestOutcome(request.prompt_len, error=f"{type(e).__name__}: {e}")
    e2e = time.perf_counter() - start
    if not done:
        return RequestOutcome(request.prompt_len, error="the stream ended without data: [DONE]")
    if ttft is None:
        return RequestOutcome(request.prompt_len, error="no output text")
    output_tokens = usage_tokens if usage_tokens is not None else len(texts)
    prompt_len = usage_prompt if usage_prompt is not None else request.prompt_len
    return RequestOutcome(
        prompt_len,
        output_tokens,
        ttft,
        e2e,
        tuple(itl),
        output_text="".join(texts),
        cached_tokens=cached_tokens,
    )


def _chunk_text(choice: dict[str, Any]) -> str:
    """A completions choice's ``text`` or a chat choice's ``delta.content``."""
    if "text" in choice:
        return str(choice["text"] or "")
    delta = choice.get("delta") or {}
    return str(delta.get("content") or "")
