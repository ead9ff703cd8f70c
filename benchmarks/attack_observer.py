"""The attacks' observer: a /health prober and a victim client in a child process of their own, so that an
attacker's busy loop never delays them; one :class:`Observation` per :class:`Window`."""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import aiohttp

PROBE_INTERVAL_S = 0.02
VICTIM_TIMEOUT_S = 120.0  # a victim request unanswered this long counts as failed


@dataclass(frozen=True)
class Window:
    """Observe this server until None comes."""

    url: str
    model: str
    api_key: str | None


@dataclass
class Observation:
    """What the prober and the victim saw in one window."""

    health_ms: list[float] = field(default_factory=list)
    health_not_200: int = 0
    chat_s: list[float] = field(default_factory=list)
    completion_s: list[float] = field(default_factory=list)
    victim_ok: int = 0
    victim_failed: int = 0


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def _observe(window: Window, pipe: Connection) -> Observation:
    seen, stop = Observation(), asyncio.Event()
    chat = {"model": window.model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
    completion = {"model": window.model, "prompt": "ROMEO:", "max_tokens": 32, "ignore_eos": True}
    victims = [
        ("/v1/chat/completions", chat, seen.chat_s),
        ("/v1/completions", completion, seen.completion_s),
    ]
    limit = aiohttp.ClientTimeout(total=VICTIM_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=limit, headers=auth_headers(window.api_key)) as session:

        async def status(path: str, body: object = None) -> int:
            try:
                async with session.request("POST" if body else "GET", window.url + path, json=body) as r:
                    await r.read()
                    return r.status
            except (TimeoutError, aiohttp.ClientError):
                return 0

        async def probe() -> None:
            while not stop.is_set():
                started = time.monotonic()
                seen.health_not_200 += await status("/health") != 200
                seen.health_ms.append((time.monotonic() - started) * 1000)
                await asyncio.sleep(PROBE_INTERVAL_S)

        async def victim() -> None:
            while not stop.is_set():
                for path, body, latencies in victims:
                    started = time.monotonic()
                    ok = await status(path, body) == 200
                    latencies.append(time.monotonic() - started)
                    seen.victim_ok, seen.victim_failed = seen.victim_ok + ok, seen.victim_failed + (not ok)
                await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(probe()), asyncio.create_task(victim())]
        await asyncio.to_thread(pipe.recv)  # None: the attack is over
        stop.set()  # the victim's request in flight still ends: it is the stall being measured
        await asyncio.gather(*tasks)
    return seen


def observe_windows(pipe: Connection) -> None:
    """The observer process: one :class:`Observation` per :class:`Window`, until the pipe closes."""
    while True:
        try:
            window = pipe.recv()
        except EOFError:
            return
        pipe.send(asyncio.run(_observe(window, pipe)))


class Observer:
    """The /health prober and the victim, in a child process of their own (stopped by ``close``)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(target=observe_windows, args=(child,), daemon=True)
        self._process.start()
        child.close()
        print(f"observer pid {self._process.pid}", file=sys.stderr, flush=True)

    def begin(self, window: Window) -> None:
        self._pipe.send(window)

    def end(self) -> Observation:
        self._pipe.send(None)
        if not self._pipe.poll(VICTIM_TIMEOUT_S + 30.0):
            raise RuntimeError("the observer process did not report: is it still running?")
        observation = self._pipe.recv()
        assert isinstance(observation, Observation), observation
        return observation

    def close(self) -> None:
        """Closing the pipe ends the child; SIGKILL to its pid if it is still there after 10 s."""
        self._pipe.close()
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
