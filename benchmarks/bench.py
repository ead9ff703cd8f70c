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
from pathlib import Path

from openinfer.benchmarks.bench_run import BenchError, RunConfig, first_model, run_benchmark
from openinfer.benchmarks.conversations import Conversation, sample_conversations
from openinfer.benchmarks.datasets import DATASET_NAMES, DatasetConfig
from openinfer.benchmarks.plot import PlotSeries, plot_acceptance
from openinfer.benchmarks.request_client import SamplingConfig
from openinfer.benchmarks.sweep import main as sweep_main
from openinfer.benchmarks.vocabulary import load_tokenizer
from openinfer.benchmarks.workload_flags import add_workload_args, check_workload_args, dataset_config
from openinfer.engine_core.config import from_flags


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
