"""The bench's client side: one streamed request timed from real chunk arrivals, arrivals, and the report."""

from __future__ import annotations

import math

import aiohttp
import pytest

from openinfer.benchmarks.datasets import SampledRequest
from openinfer.benchmarks.load_report import LoadReport, percentile
from openinfer.benchmarks.load_runner import arrival_gaps, run_load
from openinfer.benchmarks.request_client import RequestOutcome, SamplingConfig, send_request
from tests.benchmarks.openai_fake import CACHED_TOKENS, REPLY, FakeServer

REQUEST = SampledRequest("to be", prompt_len=2, max_tokens=3)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_timings_come_from_chunk_arrivals(fake: tuple[FakeServer, str], endpoint: str) -> None:
    """TTFT at the first chunk with text (not chat's empty role chunk); ITL the gaps between text chunks;
    TPOT (E2E - TTFT) / (tokens - 1); token counts and cached prompt tokens from the usage chunk; the reply's
    text kept."""
    server, url = fake
    sampling = SamplingConfig("m", endpoint, temperature=0.0, ignore_eos=True)
    async with aiohttp.ClientSession() as session:
        outcome = await send_request(session, url, REQUEST, sampling)
    assert outcome.error is None
    assert (outcome.prompt_len, outcome.output_tokens) == (7, 3)  # the server's usage, not our 2
    assert (outcome.cached_tokens, outcome.output_text) == (CACHED_TOKENS, REPLY)
    assert len(outcome.itl) == 2  # the gaps between the three text chunks: none for the role or usage chunk
    assert outcome.ttft is not None and outcome.e2e is not None and outcome.tpot is not None
    # In order on the client's clock: the first text chunk, the two gaps to the last, then usage and [DONE]
    # after the server's last pause; and the client's request spans the server's.
    assert 0 < outcome.ttft < outcome.ttft + sum(outcome.itl) < outcome.e2e
    [received] = server.received
    assert outcome.e2e >= received.finished - received.started
    assert outcome.tpot == (outcome.e2e - outcome.ttft) / 2  # 3 tokens: 2 after the first
    body = server.bodies[0]
    assert body["temperature"] == 0.0 and body["ignore_eos"] is True and body["stream"] is True
    if endpoint == "chat":
        assert (
            body["messages"] == [{"role": "user", "content": "to be"}] and body["max_completion_tokens"] == 3
        )
    else:
        assert body["prompt"] == "to be" and body["max_tokens"] == 3


async def test_failures_are_reported_not_raised(fake: tuple[FakeServer, str]) -> None:
    """An HTTP error and a stream cut before [DONE] are failed requests, each saying why."""
    _, url = fake
    async with aiohttp.ClientSession() as session:
        missing = await send_request(
            session, url, REQUEST, SamplingConfig("missing", "completions", 0.0, False)
        )
        cut = await send_request(
            session, url, REQUEST, SamplingConfig("truncated", "completions", 0.0, False)
        )
    assert (
        missing.error is not None
        and missing.error.startswith("HTTP 404")
        and "no such model" in missing.error
    )
    assert cut.error == "the stream ended without data: [DONE]"


async def test_concurrency_caps_requests_in_flight(fake: tuple[FakeServer, str]) -> None:
    """4 requests, 2 at a time: never more than 2 streaming at once on the server; all at once: 4."""
    server, url = fake
    sampling = SamplingConfig("m", "completions", 0.0, False)
    async with aiohttp.ClientSession() as session:
        capped = await run_load(session, url, [REQUEST] * 4, sampling, 2, math.inf, seed=0, progress=False)
        unbounded = await run_load(
            session, url, [REQUEST] * 4, sampling, None, math.inf, seed=0, progress=False
        )
    assert len(capped.ok) == len(unbounded.ok) == 4
    assert server.max_in_flight(server.received[:4]) == 2
    assert server.max_in_flight(server.received[4:]) == 4


def test_poisson_arrivals_are_seeded() -> None:
    """Exponential gaps of mean 1 / rate, none before the first request; an infinite rate sends all at once."""
    gaps = arrival_gaps(4001, request_rate=4.0, seed=7)
    assert gaps[0] == 0.0 and gaps == arrival_gaps(4001, 4.0, seed=7)
    assert sum(gaps) / 4000 == pytest.approx(0.25, rel=0.1)
    assert arrival_gaps(3, math.inf, seed=7) == [0.0, 0.0, 0.0]


def test_report_aggregates() -> None:
    """Throughput over the run's wall time; latency stats over successful requests only, in ms; cached
    prompt tokens summed over the requests whose usage reports them (None when none does)."""
    outcomes = [
        RequestOutcome(10, 5, ttft=0.1, e2e=0.5, itl=(0.1, 0.1, 0.1, 0.1)),
        RequestOutcome(20, 3, ttft=0.2, e2e=0.4, itl=(0.1, 0.1)),
        RequestOutcome(30, error="HTTP 500: boom"),
    ]
    report = LoadReport(outcomes, duration=2.0, max_concurrency=2, request_rate=math.inf)
    assert (report.request_throughput, report.output_throughput, report.total_token_throughput) == (
        1.0,
        4.0,
        19.0,
    )
    assert report.ttft.mean == pytest.approx(150) and report.ttft.p99 == pytest.approx(
        199
    )  # 100 + 0.99 * 100
    assert report.tpot.mean == pytest.approx(100)  # 0.4 s / 4 and 0.2 s / 2
    assert report.itl.median == pytest.approx(100) and report.e2e.median == pytest.approx(450)
    text = report.format()
    assert "Successful requests:                     2" in text
    assert "Failed requests:                         1" in text
    assert "failed (1x): HTTP 500: boom" in text
    assert report.to_json()["errors"] == {"HTTP 500: boom": 1}
    assert report.cached_tokens is None  # no request's usage said
    cached = [RequestOutcome(10, 1, 0.1, 0.1, cached_tokens=n) for n in (0, 6)] + [
        RequestOutcome(5, 1, 0.1, 0.1)
    ]
    assert LoadReport(cached, 1.0, None, math.inf).cached_tokens == 6  # over the requests that reported it


def test_percentile_interpolates_like_numpy() -> None:
    """Linear interpolation between ranks; NaN without values."""
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert math.isnan(percentile([], 50))
