"""Send requests at a Poisson rate with at most ``max_concurrency`` in flight, showing progress on stderr."""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time

import aiohttp
from tqdm import tqdm

from openinfer.benchmarks.datasets import SampledRequest
from openinfer.benchmarks.load_report import LoadReport
from openinfer.benchmarks.request_client import RequestOutcome, SamplingConfig, send_request


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
    """Send every request (arrivals by ``arrival_gaps``, in-flight requests capped) and time the whole run."""
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = tqdm(total=len(requests), desc="requests", unit="req", file=sys.stderr, disable=not progress)

    async def one(request: SampledRequest) -> RequestOutcome:
        if semaphore is None:
            outcome = await send_request(session, base_url, request, sampling)
        else:
            async with semaphore:
                outcome = await send_request(session, base_url, request, sampling)
        bar.update(1)
        if outcome.error is not None:
            bar.set_postfix_str("failed: see the report", refresh=False)
        return outcome

    start = time.perf_counter()
    tasks = []
    for request, gap in zip(requests, arrival_gaps(len(requests), request_rate, seed), strict=True):
        if gap > 0:
            await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(one(request)))
    outcomes = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    bar.close()
    return LoadReport(list(outcomes), duration, max_concurrency, request_rate)
