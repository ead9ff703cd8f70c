"""The server an attacker attacks (:class:`Target`), and the HTTP reads every attacker uses: a POST's status,
a GET, a /metrics sum, the model's length, the engines up."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp


@dataclass(frozen=True)
class Target:
    """The server under attack (its HTTP API, engine ports and files) and the attacks' bounds."""

    session: aiohttp.ClientSession  # sends the API key, if the server has one
    host: str
    port: int  # HTTP
    api_key: str | None
    model: str  # the served model's name
    engine_port: int  # the frontend's request port; outputs arrive on the next one
    spec_log_dir: Path
    state_dir: Path
    seconds: float  # how long each attack runs
    idle_seconds: float  # how long slow and idle connections are held
    body_mb: float  # the size of each big body
    schema_depth: int  # nesting of the slow JSON schemas
    hellos: int  # forged hellos of distinct indices, at most
    serve_pid: int  # openinfer-serve's: its children by role are serve_children(serve_pid)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def body(self, **fields: Any) -> dict[str, Any]:
        """A small completion's body, with ``fields`` added."""
        return {"model": self.model, "prompt": "ROMEO:", "max_tokens": 2, **fields}


Attacker = Callable[[Target], Awaitable[str]]

# The --admin-api-key of the servers that attacks through /admin run against (attackers.SERVE_FLAGS).
ADMIN_KEY = "attack-admin-key"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


async def post(target: Target, body: object, timeout: float = 60.0) -> int:
    """POST a completion (bytes are sent as they are): its status, 0 when none came within ``timeout``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers, limit = {"Content-Type": "application/json"}, aiohttp.ClientTimeout(total=timeout)
    try:
        async with target.session.post(
            f"{target.url}/v1/completions", data=data, headers=headers, timeout=limit
        ) as r:
            await r.read()
            return r.status
    except (TimeoutError, aiohttp.ClientError):
        return 0


async def get(target: Target, path: str) -> Any:
    """A route's JSON (its text for /metrics); None when it does not answer 200."""
    async with target.session.get(target.url + path) as response:
        text = await response.text()
    return None if response.status != 200 else text if path == "/metrics" else json.loads(text)


async def metric_sum(target: Target, sample: str) -> float:
    """The sum over every series of one /metrics sample."""
    lines = (await get(target, "/metrics")).splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(sample + "{"))


async def max_model_len(target: Target) -> int:
    """The served model's max_model_len on /v1/models; 0 while no engine serves it."""
    models = (await get(target, "/v1/models") or {"data": []})["data"]
    return next((int(m["max_model_len"]) for m in models if m["id"] == target.model), 0)


async def engines_up(target: Target) -> int:
    return int((await get(target, "/health") or {"engines_up": 0})["engines_up"])


def tally(statuses: list[int]) -> str:
    """``"256×500, 44×503"`` (0: no answer)."""
    return ", ".join(f"{n}×{s or 'no answer'}" for s, n in sorted(Counter(statuses).items()))
