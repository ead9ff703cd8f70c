"""One benchmark run against one running server: warm up, scrape ``/metrics``, send the load, scrape again.

``openinfer-bench`` runs it once against the server it is pointed at; ``openinfer-bench sweep`` once per cell of
its grid, on servers it starts itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from openinfer.benchmarks.acceptance import (
    AcceptanceReport,
    MetricsSnapshot,
    SpecLogCheck,
    check_spec_logs,
    scrape_settled,
)
from openinfer.benchmarks.conversations import Conversation
from openinfer.benchmarks.load_report import LoadReport
from openinfer.benchmarks.load_runner import run_conversations
from openinfer.benchmarks.prefix_cache import PrefixCacheReport
from openinfer.benchmarks.request_client import SamplingConfig, send_request

WARMUP_MAX_TOKENS = 16


class BenchError(Exception):
    """The run cannot go on (server unreachable, warm-up failed, bad dataset); the message says why."""


@dataclass(frozen=True)
class RunConfig:
    """One run against one server: where, how hard, and what to check afterwards."""

    base_url: str  # server root, without /v1
    api_key: str | None
    max_concurrency: int | None  # None: unbounded
    request_rate: float  # requests per second; inf: all at once
    seed: int  # arrival times (the prompts have their own)
    num_warmups: int  # requests sent before the "before" scrape, not counted
    request_timeout: float  # seconds a stream may stay silent
    spec_logs: Path | None  # the engines' spec-log folder, to check the deltas against
    progress: bool


@dataclass(frozen=True)
class BenchResult:
    """One run: the load report, the acceptance deltas (None when /metrics could not be read, and why) and the
    prefix-cache figures."""

    model: str
    load: LoadReport
    acceptance: AcceptanceReport | None
    acceptance_error: str | None
    spec_logs: SpecLogCheck | None
    prefix_cache: PrefixCacheReport

    def format(self) -> str:
        lines = [self.load.format(), " Speculative decoding (/metrics deltas) ".center(50, "-")]
        lines.append(
            self.acceptance.format() if self.acceptance else f"not available: {self.acceptance_error}"
        )
        if self.spec_logs is not None:
            lines.append(self.spec_logs.format())
        lines += [" Prefix cache ".center(50, "-"), self.prefix_cache.format()]
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "load": self.load.to_json(),
            "acceptance": self.acceptance.to_json() if self.acceptance else None,
            "acceptance_error": self.acceptance_error,
            "spec_logs": self.spec_logs.to_json() if self.spec_logs else None,
            "prefix_cache": self.prefix_cache.to_json(),
        }


async def run_benchmark(
    config: RunConfig, conversations: list[Conversation], sampling: SamplingConfig
) -> BenchResult:
    """Warm up (the first turns, short), scrape /metrics (settled), send the load, scrape again, check the
    spec logs if asked.

    Raises ``BenchError`` when the server cannot be reached or the warm-up fails.
    """
    base_url = config.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=config.request_timeout)
    connector = aiohttp.TCPConnector(limit=config.max_concurrency or 0)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector) as session:
        for conversation in conversations[: config.num_warmups]:
            first = conversation.turns[0]
            short = replace(first, max_tokens=min(first.max_tokens, WARMUP_MAX_TOKENS))
            warmup = await send_request(session, base_url, short, sampling)
            if warmup.error is not None:
                raise BenchError(f"the warm-up request to {base_url} failed: {warmup.error}")
        before, error = await _settled_metrics(f"{base_url}/metrics")
        load = await run_conversations(
            session,
            base_url,
            conversations,
            sampling,
            config.max_concurrency,
            config.request_rate,
            config.seed,
            config.progress,
        )
    after, after_error = (None, error) if before is None else await _settled_metrics(f"{base_url}/metrics")
    acceptance = AcceptanceReport(before, after) if before and after else None
    spec_logs = None
    if config.spec_logs is not None and acceptance is not None:
        try:
            spec_logs = check_spec_logs(acceptance, config.spec_logs)
        except (OSError, ValueError) as e:
            raise BenchError(f"--spec-logs: {e}") from e
    prefix_cache = PrefixCacheReport(
        before.prefix_cache if before else None, after.prefix_cache if after else None, load.cached_tokens
    )
    return BenchResult(sampling.model, load, acceptance, after_error, spec_logs, prefix_cache)


async def _settled_metrics(url: str) -> tuple[MetricsSnapshot | None, str | None]:
    try:
        return await asyncio.to_thread(scrape_settled, url), None
    except (OSError, ValueError) as e:
        return None, f"{url}: {e}"


async def first_model(base_url: str, api_key: str | None) -> str:
    """The first model ``/v1/models`` lists (what ``--model`` defaults to)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = f"{base_url.rstrip('/')}/v1/models"
    try:
        async with aiohttp.ClientSession(headers=headers) as session, session.get(url) as response:
            if response.status != 200:
                raise BenchError(f"GET {url} answered {response.status}: pass --model (and --api-key?)")
            models = (await response.json())["data"]
    except aiohttp.ClientError as e:
        raise BenchError(f"cannot reach {url} ({e}): is the server running?") from e
    if not models:
        raise BenchError(f"{url} lists no model: pass --model")
    return str(models[0]["id"])
