"""``openinfer-bench``: load, latency and speculative-decoding acceptance of a running server.

::

    openinfer-bench [serve] --base-url http://127.0.0.1:8000 --dataset-name random --num-prompts 16 \\
        --max-concurrency 4 [--spec-logs DIR] [--json OUT] [--plot OUT.png]
    openinfer-bench sweep --help          # datasets x concurrency x drafters on servers it starts itself

Flags carry ``vllm bench serve``'s names. It sends streamed requests (completions or chat) at a Poisson
``--request-rate`` with at most ``--max-concurrency`` in flight, then prints vLLM's result block (throughput;
TTFT, TPOT, ITL and E2E latency mean, median and p99 from real timestamps; failed requests and why) and the
seed's acceptance table from the ``/metrics`` deltas, summed over engines and per engine. It works against
vLLM too (its /metrics has no accepted-length histogram: those rows say "n/a"). ``--spec-logs DIR`` also
checks the deltas against the engines' spec logs, bin by bin. Exit 0; 1 when no request succeeded or the
spec logs disagree; 2 on a usage error or an unreachable server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from openinfer.benchmarks.acceptance import (
    AcceptanceReport,
    MetricsSnapshot,
    SpecLogCheck,
    check_spec_logs,
    scrape_settled,
)
from openinfer.benchmarks.datasets import DATASET_NAMES, DatasetConfig, SampledRequest, sample_requests
from openinfer.benchmarks.load_report import LoadReport
from openinfer.benchmarks.load_runner import run_load
from openinfer.benchmarks.plot import PlotSeries, plot_acceptance
from openinfer.benchmarks.request_client import ENDPOINTS, SamplingConfig, send_request
from openinfer.benchmarks.vocabulary import load_tokenizer
from openinfer.engine_core.config import from_flags

WARMUP_MAX_TOKENS = 16
# vLLM's --endpoint values, accepted so that scripts carry over.
ENDPOINT_ALIASES = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


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
    """One run: the load report, and the acceptance deltas (None when /metrics could not be read, and why)."""

    model: str
    load: LoadReport
    acceptance: AcceptanceReport | None
    acceptance_error: str | None
    spec_logs: SpecLogCheck | None

    def format(self) -> str:
        lines = [self.load.format(), " Speculative decoding (/metrics deltas) ".center(50, "-")]
        lines.append(
            self.acceptance.format() if self.acceptance else f"not available: {self.acceptance_error}"
        )
        if self.spec_logs is not None:
            lines.append(self.spec_logs.format())
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "load": self.load.to_json(),
            "acceptance": self.acceptance.to_json() if self.acceptance else None,
            "acceptance_error": self.acceptance_error,
            "spec_logs": self.spec_logs.to_json() if self.spec_logs else None,
        }


async def run_benchmark(
    config: RunConfig, requests: list[SampledRequest], sampling: SamplingConfig
) -> BenchResult:
    """Warm up, scrape /metrics (settled), send the load, scrape again, check the spec logs if asked.

    Raises ``BenchError`` when the server cannot be reached or the warm-up fails.
    """
    base_url = config.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=config.request_timeout)
    connector = aiohttp.TCPConnector(limit=config.max_concurrency or 0)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector) as session:
        for request in requests[: config.num_warmups]:
            short = SampledRequest(
                request.prompt, request.prompt_len, min(request.max_tokens, WARMUP_MAX_TOKENS)
            )
            warmup = await send_request(session, base_url, short, sampling)
            if warmup.error is not None:
                raise BenchError(f"the warm-up request to {base_url} failed: {warmup.error}")
        before, error = await _settled_metrics(f"{base_url}/metrics")
        load = await run_load(
            session,
            base_url,
            requests,
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
    return BenchResult(sampling.model, load, acceptance, after_error, spec_logs)


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


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The flags a single run and a sweep share: what is sent and how (``vllm bench serve``'s names)."""
    group = parser.add_argument_group("workload")
    group.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer.json or its model folder: prompt lengths and random prompts "
        "(default: the built-in model's; a sweep's --model's)",
    )
    group.add_argument("--num-prompts", type=int, default=16, help="requests in a run")
    group.add_argument("--seed", type=int, default=0, help="picks the prompts and the arrival times")
    group.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)"
    )
    group.add_argument("--ignore-eos", action="store_true", help="generate max tokens even past EOS (vLLM)")
    group.add_argument("--max-tokens", type=int, help="every request's output length, over the dataset's own")
    group.add_argument(
        "--endpoint", default="completions", help="completions or chat (vLLM's /v1/... paths also work)"
    )
    group.add_argument(
        "--request-rate", type=float, default=math.inf, help="Poisson arrivals per second (inf)"
    )
    group.add_argument("--random-input-len", type=int, default=64)
    group.add_argument("--random-output-len", type=int, default=64)
    group.add_argument(
        "--random-range-ratio", type=float, default=0.0, help="random lengths vary by ± this share"
    )
    group.add_argument("--text-input-len", type=int, default=64, help="text: prompt tokens")
    group.add_argument("--text-output-len", type=int, default=64, help="text: output tokens")
    group.add_argument("--num-warmups", type=int, default=1, help="uncounted requests before each run")
    group.add_argument("--request-timeout", type=float, default=600, help="seconds a stream may stay silent")
    group.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def dataset_config(args: argparse.Namespace, name: str, path: Path | None) -> DatasetConfig:
    return from_flags(DatasetConfig, args, name=name, path=path)


def endpoint_name(parser: argparse.ArgumentParser, value: str) -> str:
    name = ENDPOINT_ALIASES.get(value, value)
    if name not in ENDPOINTS:
        parser.error(f"--endpoint {value!r}: use completions or chat")
    return name


def check_workload_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.request_rate <= 0:
        parser.error("--request-rate must be positive (inf: all at once)")
    if args.temperature < 0 or args.num_warmups < 0 or args.request_timeout <= 0:
        parser.error("--temperature and --num-warmups must be >= 0, --request-timeout > 0")
    args.endpoint = endpoint_name(parser, args.endpoint)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="openinfer-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root, without /v1")
    parser.add_argument("--model", help="model name to request (default: the first in /v1/models)")
    parser.add_argument("--dataset-name", choices=DATASET_NAMES, default="random")
    parser.add_argument("--dataset-path", type=Path, help="the file for text, sharegpt and jsonl")
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
        requests = sample_requests(dataset_config(args, args.dataset_name, args.dataset_path), tokenizer)
    except ValueError as e:
        print(f"openinfer-bench: {e}", file=sys.stderr)
        return 2
    try:
        model = args.model or asyncio.run(first_model(args.base_url, args.api_key))
        sampling = SamplingConfig(model, args.endpoint, args.temperature, args.ignore_eos)
        print(describe_run(args, model, requests), flush=True)
        config = from_flags(RunConfig, args, progress=not args.disable_tqdm)
        result = asyncio.run(run_benchmark(config, requests, sampling))
    except BenchError as e:
        print(f"openinfer-bench: {e}", file=sys.stderr)
        return 2
    print(result.format())
    try:
        if args.json is not None:
            report = {"config": json_config(args, model), **result.to_json()}
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


def json_config(args: argparse.Namespace, model: str) -> dict[str, object]:
    """The settings that shape the numbers, for the JSON report."""
    return {
        "base_url": args.base_url,
        "model": model,
        "endpoint": args.endpoint,
        "dataset_name": args.dataset_name,
        "dataset_path": str(args.dataset_path) if args.dataset_path else None,
        "num_prompts": args.num_prompts,
        "max_concurrency": args.max_concurrency,
        "request_rate": None if math.isinf(args.request_rate) else args.request_rate,
        "seed": args.seed,
        "temperature": args.temperature,
        "ignore_eos": args.ignore_eos,
        "max_tokens": args.max_tokens,
    }


def describe_run(args: argparse.Namespace, model: str, requests: list[SampledRequest]) -> str:
    """The header: what is sent where, the temperature always said."""
    mode = "greedy" if args.temperature == 0 else "sampling"
    prompt_lens, output_lens = [r.prompt_len for r in requests], [r.max_tokens for r in requests]
    return (
        f"openinfer-bench: model {model} at {args.base_url} ({args.endpoint})\n"
        f"dataset {args.dataset_name}: {len(requests)} prompts of {_span(prompt_lens)} tokens, "
        f"{_span(output_lens)} output tokens, "
        f"seed {args.seed}; temperature {args.temperature} ({mode}), ignore_eos {args.ignore_eos}; "
        f"max concurrency {args.max_concurrency or 'unbounded'}, request rate {args.request_rate}"
    )


def _span(values: list[int]) -> str:
    return str(values[0]) if min(values) == max(values) else f"{min(values)}-{max(values)}"


if __name__ == "__main__":
    main()
