"""Load and observation for fault tests: streaming clients that record how each request ended, and a
scraper that checks that no counter sample ever goes down between successive /metrics scrapes, and a bounded
wait until streams have their first tokens."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# A prompt from the fake model's cycle (tokens 3..34): n-gram lookup hits from the first step.
CYCLE_PROMPT = list(range(3, 35)) * 2


@dataclass
class Outcome:
    """How one request ended: "ok", "engine_error" (an error event or body from the server), "http"
    (an error status), "connection" (no server to talk to, or the connection broke), or "timeout"."""

    kind: str
    started: float  # time.monotonic()
    ended: float
    message: str = ""
    status: int = 0


@dataclass
class Load:
    """``clients`` concurrent loops of streaming completions until ``stop()``; every outcome is kept."""

    url: str
    clients: int = 8
    timeout_s: float = 20.0  # a request still running after this is a hang: recorded as "timeout"
    model: str = "fake"
    # a connection per request: with api servers sharing the port, any of them may take each request (kept
    # connections stay with the api server that accepted them, which may be one for all of them)
    new_connections: bool = False
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.clients)]

    async def stop(self) -> None:
        """Let every client finish its request in flight (each is bounded by ``timeout_s``)."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def of_kind(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]

    async def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        connector = aiohttp.TCPConnector(force_close=self.new_connections)
        async with aiohttp.ClientSession(connector=connector) as session:
            while not self._stop.is_set():
                body = {
                    "model": self.model,
                    "prompt": CYCLE_PROMPT[rng.randrange(32) :] if rng.random() < 0.8 else "Hello there",
                    "max_tokens": rng.randrange(16, 64),
                    "temperature": rng.choice([0.0, 1.0]),
                    "ignore_eos": True,
                    "stream": True,
                }
                outcome = await self.request(session, body)
                self.outcomes.append(outcome)
                if outcome.kind in ("connection", "http"):
                    await asyncio.sleep(0.1)

    async def request(self, session: aiohttp.ClientSession, body: dict[str, object]) -> Outcome:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.post(f"{self.url}/v1/completions", json=body) as r:
                    if r.status != 200:
                        message = (await r.json())["error"]["message"]
                        return Outcome("http", started, time.monotonic(), message, r.status)
                    last: dict[str, object] = {}
                    done = False
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            last = json.loads(line[6:])
                        done = done or line.startswith(b"data: [DONE]")
                    ended = time.monotonic()
                    error = last.get("error")
                    if isinstance(error, dict):
                        return Outcome("engine_error", started, ended, str(error.get("message")), r.status)
                    if not done:
                        return Outcome("connection", started, ended, "the stream ended without [DONE]")
                    return Outcome("ok", started, ended)
        except TimeoutError:
            return Outcome("timeout", started, time.monotonic(), f"no end after {self.timeout_s} s")
        except (aiohttp.ClientError, ConnectionError) as e:
            return Outcome("connection", started, time.monotonic(), f"{type(e).__name__}: {e}")


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def counter_samples(text: str) -> Samples:
    """Every sample of every counter and histogram family, by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.type in ("counter", "histogram")
        for s in family.samples
        if not s.name.endswith("_created")
    }


@dataclass
class Scraper:
    """Scrapes /metrics every ``interval_s``; records each sample that went down or vanished between two
    successive scrapes of one frontend lifetime (``new_lifetime()`` starts another: without --state-dir a
    restarted frontend starts from zero)."""

    url: str
    interval_s: float = 0.2
    # a connection per scrape: with api servers sharing the port, scrapes reach each of them in turn
    new_connections: bool = False
    scrapes: int = 0
    decreases: list[str] = field(default_factory=list)
    last: Samples | None = None
    lifetimes: list[Samples] = field(default_factory=list)  # the last scrape of each earlier lifetime
    _lifetime: int = 0
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def new_lifetime(self) -> None:
        """Call right after killing the frontend (no await in between)."""
        if self.last is not None:
            self.lifetimes.append(self.last)
        self.last = None
        self._lifetime += 1

    async def scrape(self, session: aiohttp.ClientSession) -> Samples | None:
        lifetime = self._lifetime
        try:
            async with session.get(f"{self.url}/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status != 200:
                    return None
                samples = counter_samples(await r.text())
        except (aiohttp.ClientError, ConnectionError, TimeoutError):
            return None  # the frontend is down
        if lifetime != self._lifetime:
            return None  # answered by the frontend that was killed meanwhile
        self.scrapes += 1
        if self.last is not None:
            for key, value in self.last.items():
                now = samples.get(key)
                if now is None or now < value:
                    self.decreases.append(f"{key}: {value} -> {now}")
        self.last = samples
        return samples

    async def _run(self) -> None:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=self.new_connections)
        ) as session:
            while True:
                await self.scrape(session)
                await asyncio.sleep(self.interval_s)


async def first_tokens(session: aiohttp.ClientSession, url: str, model: str = "fake") -> float:
    """How many requests of ``model`` had their first token at this frontend (its TTFT histogram's count)."""
    async with session.get(f"{url}/metrics") as r:
        samples = counter_samples(await r.text())
    return samples.get(("vllm:time_to_first_token_seconds_count", (("model_name", model),)), 0.0)


async def wait_for_first_tokens(session: aiohttp.ClientSession, url: str, count: float) -> None:
    """Until ``count`` requests had their first token, every stream started then has tokens (so none can
    move to another engine); a bounded wait."""
    async with asyncio.timeout(30):
        while await first_tokens(session, url) < count:
            await asyncio.sleep(0.1)
