"""``openinfer-bench``: load, latency and speculative-decoding acceptance of a running server.

::

    openinfer-bench [serve] --base-url http://127.0.0.1:8000 --dataset-name random --num-prompts 16 \\
        --max-concurrency 4 [--spec-logs DIR] [--json OUT] [--plot OUT.png]
    openinfer-bench sweep --help          # datasets x concurrency x drafters on servers it starts itself

Flags carry ``vllm bench serve``'s names. It sends streamed requests (completions or chat) at a Poisson
``--request-rate`` with at most ``--max-concurrency`` in flight, then prints vLLM's result block (throughput;
TTFT, TPOT, ITL and E2E latency mean, median and p99 from real timestamps; failed requests and why) and the
seed's acceptance table from the ``/metrics`` deltas, summed over engines and per engine, and the run's
prefix-cache hit rate (``vllm:prefix_cache_*`` deltas) and cached prompt tokens (usage). It works against
vLLM too (its /metrics has no accepted-length histogram: those rows say "n/a"). ``--spec-logs DIR`` also
checks the deltas against the engines' spec logs, bin by bin. ``--dataset-name prefix_repetition`` shares
long prefixes between requests, ``multi_turn`` replays conversations turn by turn; these and ``text`` cut
their prompts from the built-in tinyshakespeare unless ``--dataset-path`` names another text. Exit 0; 1 when
no request succeeded or the spec logs disagree; 2 on a usage error or an unreachable server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
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
from openinfer.benchmarks.conversations import Conversation, sample_conversations
from openinfer.benchmarks.datasets import DATASET_NAMES, DatasetConfig
from openinfer.benchmarks.load_report import LoadReport
from openinfer.benchmarks.load_runner import run_conversations
from openinfer.benchmarks.plot import PlotSeries, plot_acceptance
from openinfer.benchmarks.prefix_cache import PrefixCacheReport
from openinfer.benchmarks.request_client import SamplingConfig, send_request
from openinfer.benchmarks.vocabulary import load_tokenizer
from openinfer.benchmarks.workload_flags import add_workload_args, check_workload_args, dataset_config
from openinfer.engine_core.config import from_flags

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


# ---- command line ----


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="openinfer-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root, without /v1")
    parser.add_argument("--model", help="model name to request (default: the first in /v1/models)")
    parser.add_argument("--dataset-name", choices=DATASET_NAMES, default="random")
    parser.add_argument(
        "--dataset-path",
        type=Path,
        help="the file for every dataset but random: any text file for text, prefix_repetition and multi_turn "
        "(default: the built-in tinyshakespeare), sharegpt's JSON, jsonl's lines",
    )
    parser.add_argument("--max-concurrency", type=int, help="requests in flight at most (default: unbounded)")
    parser.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"), help="default: $OPENAI_API_KEY"
    )
    parser.add_argument("--spec-logs", type=Path, metavar="DIR", help="check the deltas against DIR/*.jsonl")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, metavar="OUT.png", help="plot the acceptance (needs matplotlib)")
    add_workload_args(parser)
    args = parser.parse_args(argv)
    check_workload_args(parser, args)
    if args.max_concurrency is not None and args.max_concurrency < 1:
        parser.error("--max-concurrency must be >= 1")
    if args.spec_logs is not None and not args.spec_logs.is_dir():
        parser.error(
            f"--spec-logs {args.spec_logs} is not a folder: give the one the engines' --spec-log files are in"
        )
    return args


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``openinfer-bench``; ``openinfer-bench sweep ...`` runs the sweep."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sweep"]:
        from openinfer.benchmarks.sweep import main as sweep_main

        sweep_main(argv[1:])
        return
    sys.exit(run(parse_args(argv[1:] if argv[:1] == ["serve"] else argv)))


def run(args: argparse.Namespace) -> int:
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        config = dataset_config(args, args.dataset_name, args.dataset_path)
        conversations = sample_conversations(config, tokenizer)
    except ValueError as e:
        print(f"openinfer-bench: {e}", file=sys.stderr)
        return 2
    try:
        model = args.model or asyncio.run(first_model(args.base_url, args.api_key))
        sampling = SamplingConfig(model, args.endpoint, args.temperature, args.ignore_eos)
        print(describe_run(args, model, config, conversations), flush=True)
        run_config = from_flags(RunConfig, args, progress=not args.disable_tqdm)
        result = asyncio.run(run_benchmark(run_config, conversations, sampling))
    except BenchError as e:
        print(f"openinfer-bench: {e}", file=sys.stderr)
        return 2
    print(result.format())
    try:
        if args.json is not None:
            report = {"config": json_config(args, model, config), **result.to_json()}
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        if args.plot is not None and result.acceptance is not None:
            label = f"{args.dataset_name}, concurrency {args.max_concurrency or 'unbounded'}"
            series = [PlotSeries(label, result.acceptance.total, result.acceptance.after.has_histogram)]
            plot_acceptance(series, args.plot, f"{model} at {args.base_url}")
    except (OSError, RuntimeError) as e:
        print(f"openinfer-bench: {e}", file=sys.stderr)
        return 2
    if not result.load.ok:
        return 1
    return 1 if result.spec_logs is not None and not result.spec_logs.agree else 0


def json_config(args: argparse.Namespace, model: str, dataset: DatasetConfig) -> dict[str, object]:
    """The settings that shape the numbers, for the JSON report."""
    return {
        "base_url": args.base_url,
        "model": model,
        "endpoint": args.endpoint,
        "dataset_name": args.dataset_name,
        "dataset_path": str(dataset.path) if dataset.path else None,
        "num_prompts": args.num_prompts,
        "max_concurrency": args.max_concurrency,
        "request_rate": None if math.isinf(args.request_rate) else args.request_rate,
        "seed": args.seed,
        "temperature": args.temperature,
        "ignore_eos": args.ignore_eos,
        "max_tokens": args.max_tokens,
        **{flag: value for flag, value in vars(args).items() if flag.startswith(f"{args.dataset_name}_")},
    }


def describe_run(
    args: argparse.Namespace, model: str, dataset: DatasetConfig, conversations: list[Conversation]
) -> str:
    """The header: what is sent where, the temperature always said."""
    mode = "greedy" if args.temperature == 0 else "sampling"
    turns = [turn for c in conversations for turn in c.turns]
    prompt_lens, output_lens = [t.prompt_len for t in turns], [t.max_tokens for t in turns]
    prompts = f"{len(turns)} prompts of {_span(prompt_lens)} tokens"
    if max(len(c.turns) for c in conversations) > 1:
        turn_counts = [len(c.turns) for c in conversations]
        prompts = (
            f"{len(conversations)} conversations of {_span(turn_counts)} turns ({len(turns)} requests), "
            f"user messages of {_span(prompt_lens)} tokens"
        )
    return (
        f"openinfer-bench: model {model} at {args.base_url} ({args.endpoint})\n"
        f"dataset {dataset.describe()}: {prompts}, {_span(output_lens)} output tokens, "
        f"seed {args.seed}; temperature {args.temperature} ({mode}), ignore_eos {args.ignore_eos}; "
        f"max concurrency {args.max_concurrency or 'unbounded'}, request rate {args.request_rate}"
    )


def _span(values: list[int]) -> str:
    return str(values[0]) if min(values) == max(values) else f"{min(values)}-{max(values)}"


if __name__ == "__main__":
    main()
