"""The census of a body is linear in its size whatever its bytes, and exact on JSON; large bodies are counted
in a real worker process, whose censuses each get their own answer: one past its deadline, or under way as the
frontend closes, ends in a 503 with the worker killed by pid; a client that leaves while its census waits
leaves the queue at once; the queue is bounded. The worker is stopped (SIGSTOP, by pid) to hold a census
under way as long as a test needs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openinfer.frontend.openai.body.census import (
    INLINE_BYTES,
    BodyCensus,
    commas_outside_strings,
    take_census,
)
from openinfer.frontend.openai.body.census_worker import CensusWorker
from openinfer.frontend.openai.errors import ApiError
from tests.frontend.waits import alive, wait_until

_WAIT_S = 30.0  # the bound on any one census, the worker's start included
CensusFactory = Callable[..., Awaitable[CensusWorker]]


def separators(value: Any) -> int:
    """The commas a JSON writer puts between the items of ``value``'s lists and objects."""
    if isinstance(value, list):
        return max(len(value) - 1, 0) + sum(map(separators, value))
    if isinstance(value, dict):
        return max(len(value) - 1, 0) + sum(map(separators, value.values()))
    return 0


# Strings rich in what a scan of JSON can get wrong: commas, quotes and backslashes, escaped by the writer.
_TEXT = st.text(alphabet=st.sampled_from([",", '"', "\\", "a", "é", "\n", "\x01"]), max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_TEXT, children, max_size=5),
    max_leaves=40,
)


@given(value=_JSON, ascii_only=st.booleans())
def test_the_commas_between_values_are_counted_exactly(value: Any, ascii_only: bool) -> None:
    """Any JSON value, with strings full of commas, quotes and backslashes: the commas outside strings are
    exactly the separators between items."""
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert commas_outside_strings(body) == separators(value)


def test_strings_longer_than_a_window_are_counted_exactly() -> None:
    """Strings that cross the scan's 64 KiB windows, escapes split at their edges: still exact."""
    value = {"a": ',\\"' * 50_000, "b": [1, "\\" * 70_001, {"c": "," * 65_536}], "d": '"' * 65_535}
    body = json.dumps(value).encode()
    assert len(body) > 3 * 65_536
    assert commas_outside_strings(body) == 2 + 2  # between the three fields, and in b's list


@pytest.mark.timeout(60)  # the scan this replaced took hours on it (6 s for 40 KB, growing as the square)
def test_a_string_of_escaped_quotes_that_never_closes_is_not_json_at_once() -> None:
    """{"prompt": " and then a megabyte of \\" with no closing quote: not JSON, said at once; the commas of
    such bytes, were they counted, come in one pass too."""
    body = b'{"prompt": "' + b'\\"' * (INLINE_BYTES // 2 - 8)
    assert len(body) <= INLINE_BYTES
    census = take_census(body)
    assert census.not_json == "Input data was truncated"
    assert commas_outside_strings(b"[" + body) == 0


def empty_messages(count: int) -> bytes:
    """A chat body of ``count`` empty messages (``count - 1`` commas): past INLINE_BYTES from 350,000."""
    return b'{"messages": [' + b",".join([b"{}"] * count) + b"]}"


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The worker (this test's own child) stopped: a census under way stays under way until it continues."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGCONT)


@pytest.fixture
async def start_census() -> AsyncIterator[CensusFactory]:
    """CensusWorkers (CensusWorker's keywords) whose worker runs: each has taken one census; all closed at
    teardown."""
    started: list[CensusWorker] = []

    async def start(**options: Any) -> CensusWorker:
        census = CensusWorker(**options)
        started.append(census)
        body = empty_messages(350_000)
        assert len(body) > INLINE_BYTES
        assert await asyncio.wait_for(census.take(body), _WAIT_S) == BodyCensus(commas=349_999)
        return census

    yield start
    for census in started:
        await census.close()


async def test_a_census_past_its_deadline_is_a_503_and_its_worker_is_replaced(
    start_census: CensusFactory,
) -> None:
    """A worker that does not answer within the deadline is killed (and waited for) before its census is
    answered 503 with Retry-After; the next census starts a new worker."""
    deadline = 3.0  # seconds: the census's configured limit, which its 503 names
    census = await start_census(timeout=deadline)
    pid = census.pid
    assert pid is not None
    with stopped(pid), pytest.raises(ApiError) as raised:
        await asyncio.wait_for(census.take(empty_messages(400_000)), _WAIT_S)
    assert raised.value.status == 503 and raised.value.headers == {"Retry-After": "1"}
    assert f"request body before decoding it took more than {deadline:g} s" in raised.value.message
    assert not alive(pid)
    assert await asyncio.wait_for(census.take(empty_messages(400_001)), _WAIT_S) == BodyCensus(commas=400_000)
    assert census.pid not in (None, pid)


async def test_closing_kills_the_worker_and_ends_its_census(start_census: CensusFactory) -> None:
    """close() with a census under way on a stopped worker (which would never see its stdin close) kills it
    and returns; the census is a 503 saying the server is shutting down, and so is any later one."""
    census = await start_census()
    pid = census.pid
    assert pid is not None
    with stopped(pid):
        under_way = asyncio.create_task(census.take(empty_messages(400_000)))
        await asyncio.wait_for(census.close(), _WAIT_S)
        assert not alive(pid)
    for take in (under_way, census.take(empty_messages(400_000))):
        with pytest.raises(ApiError) as raised:
            await asyncio.wait_for(take, _WAIT_S)
        assert raised.value.status == 503 and "shutting down" in raised.value.message


async def test_a_client_that_leaves_its_place_in_the_queue_leaves_at_once(
    start_census: CensusFactory,
) -> None:
    """Two censuses wait behind one under way (on a stopped worker), at most two may: a third is a 503 with
    Retry-After. One of the two cancelled leaves the queue at once, while the census ahead still runs; the
    others then get their own censuses."""
    census = await start_census(max_waiting=2)
    pid = census.pid
    assert pid is not None
    with stopped(pid):
        first, second, third = (
            asyncio.create_task(census.take(empty_messages(400_000 + i))) for i in range(3)
        )
        await wait_until(lambda: census.waiting == 2)
        with pytest.raises(ApiError) as raised:
            await census.take(empty_messages(400_000))
        assert raised.value.status == 503 and raised.value.headers == {"Retry-After": "1"}
        assert "2 large request bodies are waiting" in raised.value.message
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert census.waiting == 1 and not first.done()
    assert await asyncio.wait_for(first, _WAIT_S) == BodyCensus(commas=399_999)
    assert await asyncio.wait_for(third, _WAIT_S) == BodyCensus(commas=400_001)


async def test_a_client_that_leaves_mid_census_does_not_disturb_the_next(start_census: CensusFactory) -> None:
    """The caller of a census under way cancelled: it is cancelled at once, but the exchange keeps its turn
    until the worker answers, so the census behind it reads its own answer, not the one left in the pipe."""
    census = await start_census()
    pid = census.pid
    assert pid is not None
    with stopped(pid):
        first = asyncio.create_task(census.take(empty_messages(400_000)))
        second = asyncio.create_task(census.take(empty_messages(500_000)))
        await wait_until(lambda: census.waiting == 1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert census.waiting == 1 and not second.done()
    assert await asyncio.wait_for(second, _WAIT_S) == BodyCensus(commas=499_999)
    assert census.pid == pid  # the same worker answered both
