"""``openinfer-bench sweep``: datasets x concurrency x drafters, on ``openinfer-serve`` s it starts itself.

::

    openinfer-bench sweep [--model PATH] [--drafters none ngram:K=7 dflash[:PATH]:K=7] \\
        [--dataset-name random text [--dataset-path FILE]] [--max-concurrency 1 4 8] [--json OUT] [--plot OUT.png]

For each drafter it starts one ``openinfer-serve`` (the built-in model on the CPU unless ``--model``) on
free loopback ports with every engine writing a spec log, runs each dataset at each concurrency (the same
prompts for every drafter and concurrency), and stops it. It prints one markdown table, a row per run:
throughput and latency, then the seed's acceptance figures from the ``/metrics`` deltas, whether the spec
logs agree with them bin by bin, and the prefix-cache hit rate. ``--plot`` draws one series per drafter and
dataset (summed over the concurrencies). Exit 0; 1 when a run had no successful request or its spec logs
disagree; 2 on a usage error or a server that does not start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from openinfer.benchmarks.bench_run import BenchError, BenchResult, RunConfig, first_model, run_benchmark
from openinfer.benchmarks.conversations import Conversation, sample_conversations
from openinfer.benchmarks.datasets import DATASET_NAMES, TEXT_DATASETS, DatasetConfig
from openinfer.benchmarks.local_server import Drafter, LocalServer, parse_drafter
from openinfer.benchmarks.plot import PlotSeries, plot_acceptance
from openinfer.benchmarks.request_client import SamplingConfig
from openinfer.benchmarks.vocabulary import load_tokenizer
from openinfer.benchmarks.workload_flags import add_workload_args, check_workload_args, dataset_config
from openinfer.engine_core.config import from_flags
from openinfer.tools.spec_tally import AcceptanceTally, total

BUILTIN_MODEL_NAME = "openinfer-tiny-qwen3"  # what openinfer-serve serves the built-in model as
NO_VALUE = "-"


@dataclass(frozen=True)
class SweepCell:
    """One run of the grid."""

    dataset: str
    drafter: str
    concurrency: int
    result: BenchResult


def markdown_table(cells: list[SweepCell]) -> str:
    """The seed's table for a sweep: a row per run, summed over engines, the prefix-cache hit rate last."""
    header = [
        "dataset",
        "drafter",
        "concurrency",
        "output tok/s",
        "median TTFT (ms)",
        "median TPOT (ms)",
        "rounds",
        "mean accepted draft",
        "mean acceptance length",
        "acceptance rate",
        "zero-accept",
        "full-K",
        "histogram 0..K",
        "per-position rates",
        "spec logs",
        "prefix-cache hit rate",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in cells:
        load = cell.result.load
        row = [
            cell.dataset,
            cell.drafter,
            str(cell.concurrency),
            f"{load.output_throughput:.0f}",
            f"{load.ttft.median:.1f}",
            f"{load.tpot.median:.2f}",
            *_acceptance_cells(cell.result),
            cell.result.prefix_cache.hit_rate_cell(),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _acceptance_cells(result: BenchResult) -> list[str]:
    acceptance = result.acceptance
    if acceptance is None or total(acceptance.after.engines.values()).num_spec_tokens == 0:
        return [NO_VALUE] * 9
    tally, has_histogram = acceptance.total, acceptance.after.has_histogram
    histogram = " / ".join(map(str, tally.hist)) if has_histogram else "n/a"
    rates = " ".join(_fixed(rate, 3) for rate in tally.per_pos_rates())
    logs = NO_VALUE if result.spec_logs is None else ("agree" if result.spec_logs.agree else "DISAGREE")
    return [
        str(tally.num_drafts),
        _fixed(tally.mean_accepted, 3),
        _fixed(tally.mean_acceptance_length, 3),
        _percent(tally.acceptance_rate),
        _percent(tally.zero_accept_rate) if has_histogram else "n/a",
        _percent(tally.full_accept_rate) if has_histogram else "n/a",
        histogram,
        rates,
        logs,
    ]


def _fixed(value: float, digits: int) -> str:
    return NO_VALUE if math.isnan(value) else f"{value:.{digits}f}"


def _percent(value: float) -> str:
    return NO_VALUE if math.isnan(value) else f"{100 * value:.1f}%"


def plot_series(cells: list[SweepCell]) -> list[PlotSeries]:
    """One series per drafter and dataset, its tallies summed over the concurrencies."""
    grouped: dict[tuple[str, str], tuple[AcceptanceTally, bool]] = {}
    for cell in cells:
        acceptance = cell.result.acceptance
        if acceptance is None or acceptance.total.num_drafts == 0:
            continue
        tally, has_histogram = grouped.get((cell.drafter, cell.dataset), (AcceptanceTally(), True))
        tally.add(acceptance.total)
        grouped[(cell.drafter, cell.dataset)] = (tally, has_histogram and acceptance.after.has_histogram)
    return [PlotSeries(f"{d} / {ds}", t, h) for (d, ds), (t, h) in grouped.items()]


def datasets_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[DatasetConfig]:
    """``--dataset-name`` s with the ``--dataset-path`` s given in order to those that need a file; with none
    given, the text datasets cut the built-in text."""
    if not args.dataset_path:
        needs_file = [name for name in args.dataset_name if name not in ("random", *TEXT_DATASETS)]
        if needs_file:
            parser.error(
                f"--dataset-name {needs_file[0]} needs a file: give one --dataset-path per dataset "
                "that needs one"
            )
        return [dataset_config(args, name, None) for name in args.dataset_name]
    paths = list(args.dataset_path)
    configs = []
    for name in args.dataset_name:
        path = None if name == "random" else (paths.pop(0) if paths else None)
        if name != "random" and path is None:
            parser.error(
                f"--dataset-name {name} needs a file: give one --dataset-path per dataset that needs one"
            )
        configs.append(dataset_config(args, name, path))
    if paths:
        parser.error("more --dataset-path files than datasets that take one")
    return configs


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="openinfer-bench sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", type=Path, help="Hugging Face Qwen3 folder (default: the built-in model)")
    parser.add_argument(
        "--drafters",
        nargs="+",
        help="none, ngram[:K=N], dflash[:PATH][:K=N], dspark[:PATH][:K=N] (no PATH: the built-in model's "
        "drafter), each but none with an optional :adaptive; default: none and what openinfer-serve runs on "
        "the built-in model (dspark:K=7:adaptive), or with --model none and ngram:K=7",
    )
    parser.add_argument("--dataset-name", nargs="+", choices=DATASET_NAMES, default=["random"])
    parser.add_argument("--max-concurrency", type=int, nargs="+", default=[1, 4, 8], help="levels, in turn")
    parser.add_argument("--engines", type=int, default=1, help="engines per server")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--kv-cache-gb", type=float, help="openinfer-serve --kv-cache-gb")
    parser.add_argument("--max-model-len", type=int, help="openinfer-serve --max-model-len")
    parser.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="keep the servers' prefix caching on (off by default here: every concurrency resends the same "
        "prompts, and a warm cache would make the cells incomparable)",
    )
    parser.add_argument("--startup-timeout", type=float, default=300, help="seconds to wait for each server")
    parser.add_argument(
        "--log-dir", type=Path, help="servers' logs and spec logs (default: a temporary folder)"
    )
    parser.add_argument("--json", type=Path, metavar="OUT", help="write every run's results as JSON here")
    parser.add_argument("--plot", type=Path, metavar="OUT.png", help="plot the acceptance (needs matplotlib)")
    parser.add_argument(
        "--dataset-path",
        type=Path,
        nargs="+",
        default=[],
        help="one file per dataset that needs one, in order (none: text, prefix_repetition and multi_turn cut "
        "the built-in tinyshakespeare)",
    )
    add_workload_args(parser)
    args = parser.parse_args(argv)
    check_workload_args(parser, args)
    if min(args.max_concurrency) < 1 or args.engines < 1:
        parser.error("--max-concurrency and --engines must be >= 1")
    if args.drafters is None:
        args.drafters = ["none", "ngram:K=7"] if args.model else ["none", "dspark:K=7:adaptive"]
    try:
        args.drafters = [parse_drafter(text) for text in args.drafters]
    except ValueError as e:
        parser.error(str(e))
    args.datasets = datasets_from_args(parser, args)
    return args


def main(argv: list[str]) -> None:
    """Entry point of ``openinfer-bench sweep``."""
    args = parse_args(argv)
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
        sys.exit(run(args, args.log_dir))
    with tempfile.TemporaryDirectory(prefix="openinfer-sweep-") as log_dir:
        sys.exit(run(args, Path(log_dir)))


def run(args: argparse.Namespace, log_dir: Path) -> int:
    try:
        tokenizer = load_tokenizer(args.tokenizer or args.model)  # the served model's own, by default
        workloads = [(config, sample_conversations(config, tokenizer)) for config in args.datasets]
    except ValueError as e:
        print(f"openinfer-bench sweep: {e}", file=sys.stderr)
        return 2
    print(describe_sweep(args), flush=True)
    cells: list[SweepCell] = []
    try:
        for drafter in args.drafters:
            cells += sweep_drafter(args, drafter, workloads, log_dir / _folder_name(drafter.label))
    except (BenchError, RuntimeError) as e:
        print(f"openinfer-bench sweep: {e}", file=sys.stderr)
        return 2
    print(markdown_table(cells))
    try:
        if args.json is not None:
            runs = [
                {
                    "dataset": c.dataset,
                    "drafter": c.drafter,
                    "concurrency": c.concurrency,
                    **c.result.to_json(),
                }
                for c in cells
            ]
            args.json.write_text(json.dumps({"sweep": describe_sweep(args), "runs": runs}, indent=2) + "\n")
        if args.plot is not None:
            model = args.model.name if args.model else BUILTIN_MODEL_NAME
            plot_acceptance(plot_series(cells), args.plot, f"{model}: accepted drafts by drafter / dataset")
    except (OSError, RuntimeError) as e:
        print(f"openinfer-bench sweep: {e}", file=sys.stderr)
        return 2
    failed = any(not c.result.load.ok or (c.result.spec_logs and not c.result.spec_logs.agree) for c in cells)
    return 1 if failed else 0


def sweep_drafter(
    args: argparse.Namespace,
    drafter: Drafter,
    workloads: list[tuple[DatasetConfig, list[Conversation]]],
    log_dir: Path,
) -> list[SweepCell]:
    """Start a server with this drafter, run every dataset at every concurrency, stop it."""
    extra = []
    if args.kv_cache_gb is not None:
        extra += ["--kv-cache-gb", str(args.kv_cache_gb)]
    if args.max_model_len is not None:
        extra += ["--max-model-len", str(args.max_model_len)]
    if not args.enable_prefix_caching:
        extra.append("--no-enable-prefix-caching")
    log_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"starting openinfer-serve with drafter {drafter.label} (log: {log_dir})", file=sys.stderr, flush=True
    )
    cells = []
    with LocalServer(
        drafter, log_dir, args.model, args.engines, args.device, extra, args.startup_timeout
    ) as server:
        model = asyncio.run(first_model(server.url, None))
        sampling = SamplingConfig(model, args.endpoint, args.temperature, args.ignore_eos)
        for config, conversations in workloads:
            for concurrency in args.max_concurrency:
                run_config = from_flags(
                    RunConfig,
                    args,
                    base_url=server.url,
                    api_key=None,
                    max_concurrency=concurrency,
                    spec_logs=server.spec_log_dir if drafter.method else None,
                    progress=not args.disable_tqdm,
                )
                result = asyncio.run(run_benchmark(run_config, conversations, sampling))
                cells.append(SweepCell(config.describe(), drafter.label, concurrency, result))
                print(
                    f"  {config.describe()}, concurrency {concurrency}: {_summary(result)}", file=sys.stderr
                )
    return cells


def _summary(result: BenchResult) -> str:
    load = result.load
    text = f"{load.output_throughput:.0f} tok/s, {sum(load.errors.values())} failed"
    if result.acceptance is not None and result.acceptance.total.num_drafts:
        tally = result.acceptance.total
        text += f", {tally.num_drafts} rounds, acceptance {_percent(tally.acceptance_rate)}"
    if result.spec_logs is not None:
        text += ", spec logs " + ("agree" if result.spec_logs.agree else "DISAGREE")
    return text


def describe_sweep(args: argparse.Namespace) -> str:
    """What was run and where: the model, the workload, and the machine."""
    mode = "greedy" if args.temperature == 0 else "sampling"
    model = str(args.model) if args.model else f"{BUILTIN_MODEL_NAME} (built-in)"
    datasets = ", ".join(config.describe() for config in args.datasets)
    return (
        f"openinfer-bench sweep: {model} on {args.device}, {args.engines} engine(s); datasets {datasets}; "
        f"{args.num_prompts} prompts per run, seed {args.seed}, temperature {args.temperature} ({mode}), "
        f"ignore_eos {args.ignore_eos}, {args.endpoint} endpoint; "
        f"machine: {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, Python {platform.python_version()}"
    )


def _folder_name(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_=" else "_" for c in label)
