"""An OpenAI-style streaming server for the bench's client tests: 3 text chunks CHUNK_GAP_S apart per request,
each request's body and its start and end times recorded."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

CHUNK_GAP_S = 0.05  # the pause after each text chunk
REPLY = "abc"  # the text every request streams, in three chunks
CACHED_TOKENS = 4  # usage.prompt_tokens_details.cached_tokens of every answer
FAIL_WORD = "boom"  # a prompt (or last chat message) containing it is answered with HTTP 500


def sse(payload: dict[str, Any] | str) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


@dataclass(frozen=True)
class Received:
    """One request as the server saw it: its body, and when it arrived and when its stream ended."""

    body: dict[str, Any]
    started: float  # time.perf_counter()
    finished: float

    @property
    def text(self) -> str:
        """The completions prompt, or the chat messages' contents joined."""
        if "messages" in self.body:
            return "".join(m["content"] for m in self.body["messages"])
        return str(self.body["prompt"])


class FakeServer:
    """Streams REPLY for /v1/completions and /v1/chat/completions. Model "missing" is a 404; model
    "truncated" ends the stream without usage or [DONE]."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/completions", self.stream)
        self.app.router.add_post("/v1/chat/completions", self.stream)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.received]

    def max_in_flight(self, received: list[Received] | None = None) -> int:
        """The most requests (of ``received``, by default all) the server was streaming at one instant."""
        events = sorted(
            (time, change)
            for r in (self.received if received is None else received)
            for time, change in ((r.started, 1), (r.finished, -1))
        )  # at a tie the end (-1) sorts first: one request ending as another starts is not two in flight
        in_flight = peak = 0
        for _, change in events:
            in_flight += change
            peak = max(peak, in_flight)
        return peak

    async def stream(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        body = await request.json()
        if body.get("model") == "missing":
            self.received.append(Received(body, started, time.perf_counter()))
            return web.json_response({"error": {"message": "no such model"}}, status=404)
        chat = "messages" in body
        last = body["messages"][-1]["content"] if chat else body["prompt"]
        if FAIL_WORD in last:
            self.received.append(Received(body, started, time.perf_counter()))
            return web.json_response({"error": {"message": "boom"}}, status=500)
        response = web.StreamResponse()
        await response.prepare(request)
        if chat:
            await response.write(sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}))
        for text in REPLY:
            choice = {"delta": {"content": text}} if chat else {"text": text}
            await response.write(sse({"choices": [choice]}))
            await asyncio.sleep(CHUNK_GAP_S)
        if body.get("model") != "truncated":
            usage = {
                "prompt_tokens": 7,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
            }
            await response.write(sse({"choices": [], "usage": usage}))
            await response.write(sse("[DONE]"))
        self.received.append(Received(body, started, time.perf_counter()))
        return response
