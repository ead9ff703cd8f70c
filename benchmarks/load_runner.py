"""Send conversations at a Poisson rate with at most ``max_concurrency`` in flight, showing progress on stderr.

A conversation's turns go one after the other, each once the previous reply is in; independent requests are
conversations of one turn. A conversation holds its slot from its first turn to its last, so the cap is on
requests in flight either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import sys
import time

import aiohttp
from tqdm import tqdm

from openinfer.benchmarks.conversations import Conversation
from openinfer.benchmarks.datasets import SampledRequest
from openinfer.benchmarks.load_report import LoadReport
from openinfer.benchmarks.request_client import RequestOutcome, SamplingConfig, send_request

NOT_SENT = "not sent: an earlier turn of its conversation failed"


def arrival_gaps(num_requests: int, request_rate: float, seed: int) -> list[float]:
    """Seconds to wait before sending each request: exponential gaps (a Poisson process) of mean
    1 / ``request_rate``, none before the first; all zero for an infinite rate."""
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    return [0.0] + [rng.expovariate(request_rate) for _ in range(num_requests - 1)]


async def run_load(
    session: aiohttp.ClientSession,
    base_url: str,
    requests: list[SampledRequest],
    sampling: SamplingConfig,
    max_concurrency: int | None,
    request_rate: float,
    seed: int,
    progress: bool = True,
) -> LoadReport:
    """Send independent requests: ``run_conversations`` with one turn each."""
    conversations = [Conversation((request,)) for request in requests]
    return await run_conversations(
        session, base_url, conversations, sampling, max_concurrency, request_rate, seed, progress
    )


async def run_conversations(
    session: aiohttp.ClientSession,
    base_url: str,
    conversations: list[Conversation],
    sampling: SamplingConfig,
    max_concurrency: int | None,
    request_rate: float,
    seed: int,
    progress: bool = True,
) -> LoadReport:
    """Start each conversation at its ``arrival_gaps`` time (at most ``max_concurrency`` at once), send its
    turns in order, and time the whole run. The report's outcomes are in conversation order, turn by turn;
    the turns after a failed one are not sent and fail with ``NOT_SENT``."""
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    total = sum(len(c.turns) for c in conversations)
    bar = tqdm(total=total, desc="requests", unit="req", file=sys.stderr, disable=not progress)

    async def one(conversation: Conversation) -> list[RequestOutcome]:
        replies: list[RequestOutcome] = []
        async with semaphore or contextlib.nullcontext():
            while len(replies) < len(conversation.turns):
                outcome = await send_request(session, base_url, conversation.request(replies), sampling)
                bar.update(1)
                if outcome.error is not None:
                    bar.set_postfix_str("failed: see the report", refresh=False)
                    rest = conversation.turns[len(replies) + 1 :]
                    bar.update(len(rest))
                    return [*replies, outcome, *(RequestOutcome(t.prompt_len, error=NOT_SENT) for t in rest)]
                replies.append(outcome)
        return replies

    start = time.perf_counter()
    tasks = []
    gaps = arrival_gaps(len(conversations), request_rate, seed)
    for conversation, gap in zip(conversations, gaps, strict=True):
        if gap > 0:
            await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(one(conversation)))
    outcomes = [outcome for turns in await asyncio.gather(*tasks) for outcome in turns]
    duration = time.perf_counter() - start
    bar.close()
    return LoadReport(outcomes, duration, max_concurrency, request_rate)
