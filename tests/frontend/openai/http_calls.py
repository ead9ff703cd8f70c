"""HTTP calls the frontend's API tests make: a body posted, a stream read whole, and the chat messages the
tiny template renders."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.frontend.frontends import Frontend


async def post(
    frontend: Frontend, body: object, headers: dict[str, str] | None = None, path: str = "/v1/completions"
) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
        async with session.post(f"{frontend.url}{path}", data=data, headers=headers) as response:
            return response.status, await response.json()


async def get(frontend: Frontend, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{frontend.url}{path}", headers=headers) as response:
            return response.status, await response.text()


async def stream(frontend: Frontend, body: dict[str, Any]) -> list[Any]:
    """The SSE events of a streaming completion, decoded; "[DONE]" stays a string."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{frontend.url}/v1/completions", json={**body, "stream": True}) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            raw = await response.text()
    events = [block.removeprefix("data: ") for block in raw.split("\n\n") if block]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


async def request(
    frontend: Frontend, method: str, path: str, body: object = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    async with aiohttp.ClientSession() as session:
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers = {"Content-Type": "application/json", **(headers or {})}
        async with session.request(method, f"{frontend.url}{path}", data=data, headers=headers) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None, response.headers


MESSAGES = [
    {"role": "system", "content": "the quick brown fox"},
    {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]},
]


async def chat(frontend: Frontend, body: object, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        url = f"{frontend.url}/v1/chat/completions"
        headers = {"Content-Type": "application/json", **(headers or {})}
        async with session.post(url, data=data, headers=headers) as response:
            return response.status, await response.json()


async def chat_stream(frontend: Frontend, body: dict[str, Any]) -> list[Any]:
    """The SSE events of a streaming chat completion, decoded; "[DONE]" stays a string."""
    async with aiohttp.ClientSession() as session:
        url = f"{frontend.url}/v1/chat/completions"
        async with session.post(url, json={**body, "stream": True}) as response:
            assert response.status == 200 and response.content_type == "text/event-stream"
            raw = await response.text()
    events = [block.removeprefix("data: ") for block in raw.split("\n\n") if block]
    return [event if event == "[DONE]" else json.loads(event) for event in events]
