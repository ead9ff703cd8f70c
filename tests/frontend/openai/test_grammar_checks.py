"""Structured-outputs constraints are checked in worker processes with a deadline: one past it is a 400 and
its worker is killed and replaced, a client that leaves has its check killed, one that waits too long for a
worker is a 503, and chat requests never wait behind the checks. Real worker processes, over real HTTP
(skipped without xgrammar, but the last)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
from typing import Any

import aiohttp
import pytest

from openinfer.frontend.openai.api_server import GRAMMAR_CHECKS
from openinfer.frontend.openai.errors import ApiError
from openinfer.frontend.openai.grammar_pool import MAX_WORKERS, GrammarCheckPool
from openinfer.frontend.openai.structured_constraint import StructuredConstraint
from openinfer.protocol import StructuredOutputs
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.waits import alive, wait_until

needs_xgrammar = pytest.mark.skipif(
    importlib.util.find_spec("xgrammar") is None, reason="xgrammar not installed"
)

# xgrammar converts this pattern for minutes (3,000 repetitions: 0.6 s, 6,000: 3 s, 12,000: 7 s, growing
# faster than the square), so a check of it outlives every test here.
SLOW = {"type": "string", "pattern": "[a-z]{50000}"}
_WAIT_S = 30.0  # a worker's start (xgrammar imports torch: seconds) and an answer


def completion(schema: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": "hi", "max_tokens": 1, "structured_outputs": {"json": schema}}


async def post(frontend: Frontend, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async with session.post(f"{frontend.url}{path}", json=body) as response:
            return response.status, await response.json()


def pool(frontend: Frontend) -> GrammarCheckPool:
    return frontend.runner.app[GRAMMAR_CHECKS]


@needs_xgrammar
async def test_a_constraint_past_the_deadline_is_a_400_and_its_worker_is_replaced(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """With a 1 s deadline the slow schema is a 400 naming structured_outputs and the flag, before any engine
    sees it; its worker is killed and a new one kept warm, in which the next constraints compile, or are
    refused in xgrammar's words (a refusal keeps its worker)."""
    frontend = await start_frontend(grammar_check_timeout=1.0)
    peer = await start_peer(frontend)
    request = asyncio.create_task(post(frontend, "/v1/completions", completion(SLOW)))
    await wait_until(lambda: bool(pool(frontend).busy_pids), _WAIT_S)
    [slow_pid] = pool(frontend).busy_pids
    status, body = await asyncio.wait_for(request, _WAIT_S)
    assert status == 400 and body["error"]["param"] == "structured_outputs"
    assert body["error"]["message"].startswith(
        "the JSON schema took more than 1 s to compile (the server's --grammar-check-timeout)"
    )
    await wait_until(lambda: not alive(slow_pid), _WAIT_S)
    await wait_until(lambda: len(pool(frontend).worker_pids) == 1, _WAIT_S)  # the warm one
    assert slow_pid not in pool(frontend).worker_pids and peer.requests == {}  # no engine compiles it
    status, _ = await post(frontend, "/v1/completions", completion({"type": "object"}))
    assert status == 200
    workers = pool(frontend).worker_pids
    status, body = await post(frontend, "/v1/completions", completion({"type": "objekt"}))
    assert (
        status == 400
        and body["error"]["message"] == 'the JSON schema does not compile: Unsupported type "objekt"'
    )
    assert pool(frontend).worker_pids == workers


@needs_xgrammar
async def test_a_client_that_leaves_mid_check_has_its_worker_killed(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Closing the connection while its schema is checked kills that worker (a thread could not be stopped);
    nothing reaches the engine, and a warm worker takes its place; one that dies idle is replaced too."""
    frontend = await start_frontend(grammar_check_timeout=600.0)
    peer = await start_peer(frontend)
    request = asyncio.create_task(post(frontend, "/v1/completions", completion(SLOW)))
    await wait_until(lambda: bool(pool(frontend).busy_pids), _WAIT_S)
    [slow_pid] = pool(frontend).busy_pids
    request.cancel()  # the client's session closes the connection
    await asyncio.gather(request, return_exceptions=True)
    await wait_until(lambda: not alive(slow_pid), _WAIT_S)
    await wait_until(lambda: len(pool(frontend).worker_pids) == 1, _WAIT_S)
    assert pool(frontend).busy_pids == [] and peer.requests == {}
    [warm_pid] = pool(frontend).worker_pids
    os.kill(warm_pid, signal.SIGKILL)  # an idle worker dies (this test's own child, by pid)
    await wait_until(lambda: not alive(warm_pid), _WAIT_S)
    status, _ = await post(frontend, "/v1/completions", completion({"type": "object"}))
    assert status == 200  # served by a new worker, not blamed on the request


@needs_xgrammar
async def test_chat_is_answered_while_every_grammar_worker_is_busy(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Every worker busy with a slow schema and one more schema waiting: a chat request (template rendered in
    a worker of its own, tokenized in the default thread pool) is answered while they all still run; closing
    the frontend kills every worker."""
    frontend = await start_frontend(grammar_check_timeout=600.0)
    await start_peer(frontend)
    slow = [
        asyncio.create_task(post(frontend, "/v1/completions", completion(SLOW)))
        for _ in range(MAX_WORKERS + 1)
    ]
    await wait_until(lambda: len(pool(frontend).busy_pids) == MAX_WORKERS, _WAIT_S)
    busy = pool(frontend).busy_pids
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    status, body = await asyncio.wait_for(post(frontend, "/v1/chat/completions", chat), _WAIT_S)
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert not any(task.done() for task in slow) and pool(frontend).busy_pids == busy
    for task in slow:
        task.cancel()
    await asyncio.gather(*slow, return_exceptions=True)
    await pool(frontend).close()
    assert not any(alive(pid) for pid in busy) and pool(frontend).worker_pids == []


@needs_xgrammar
async def test_a_check_that_waits_too_long_for_a_worker_is_a_503() -> None:
    """Every worker busy with a slow schema (a 600 s deadline): a check that finds none free within the 0.5 s
    wait bound is a 503 with Retry-After saying so, instead of waiting out the slow ones' deadlines; they run
    on."""
    checks = GrammarCheckPool(timeout=600.0, wait_timeout=0.5)
    slow = [asyncio.create_task(checks.check(schema_constraint(SLOW))) for _ in range(MAX_WORKERS)]
    try:
        await wait_until(lambda: len(checks.busy_pids) == MAX_WORKERS, _WAIT_S)
        with pytest.raises(ApiError) as raised:
            await asyncio.wait_for(checks.check(schema_constraint({"type": "object"})), _WAIT_S)
        assert raised.value.status == 503 and raised.value.headers == {"Retry-After": "1"}
        assert raised.value.message == (
            f"every one of the {MAX_WORKERS} workers that check structured-outputs constraints was busy for "
            "0.5 s; retry later"
        )
        assert not any(task.done() for task in slow) and len(checks.busy_pids) == MAX_WORKERS
    finally:
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        await checks.close()


def schema_constraint(schema: dict[str, Any]) -> StructuredConstraint:
    return StructuredConstraint(StructuredOutputs("json", json.dumps(schema)), "structured_outputs")


async def test_without_xgrammar_nothing_is_checked_and_no_worker_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The slim frontend image has no xgrammar: a check passes at once, with no worker (the engine refuses
    what does not compile, a 400 too)."""
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # find_spec finds nothing, as in the image
    checks = GrammarCheckPool(timeout=1.0, wait_timeout=1.0)
    await checks.check(StructuredConstraint(StructuredOutputs("regex", "[a-z"), "structured_outputs"))
    assert checks.worker_pids == []
