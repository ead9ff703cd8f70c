"""A fleet's prefix-cache hit rate and TTFT under PyPI's vllm-router: two ``openinfer-serve`` nodes behind
``kv_aware`` (fed by their KV events), ``cache_aware`` and ``round_robin``, beside one node alone.

Each setup starts fresh nodes (the built-in model, empty caches), sends the same ``prefix_repetition`` load
(vLLM's workload: P shared prefixes, each followed by a suffix of its own) through the router, and reads the
hit rate from the nodes' own ``vllm:prefix_cache_*`` counters (summed over nodes: the fleet's) and TTFT from
the load. Prints one table row per setup::

    python -m openinfer.benchmarks.router_fleet --num-prompts 60 --num-prefixes 6
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from openinfer.benchmarks.bench_run import RunConfig, run_benchmark
from openinfer.benchmarks.conversations import sample_conversations
from openinfer.benchmarks.datasets import DatasetConfig
from openinfer.benchmarks.fleet import POLICIES, Fleet
from openinfer.benchmarks.prefix_cache import PrefixCacheCounts, prefix_cache_counts
from openinfer.benchmarks.request_client import SamplingConfig
from openinfer.benchmarks.vocabulary import load_tokenizer
from openinfer.engine_core.builtin_model import BUILTIN_MODEL_NAME, builtin_text_path
from openinfer.tools.spec_tally import scrape_metrics

ALONE = "one node"


def fleet_counts(fleet: Fleet) -> PrefixCacheCounts:
    """The prefix-cache counters summed over every node and engine."""
    total = PrefixCacheCounts()
    for node in fleet.nodes:
        for counts in prefix_cache_counts(scrape_metrics(f"{node.url}/metrics")).values():
            total = total.plus(counts)
    return total


def run_setup(setup: str, args: argparse.Namespace, log_dir: Path) -> str:
    """One setup's table row: fresh nodes, the router (none for one node alone), the load."""
    nodes, policy = (1, None) if setup == ALONE else (2, setup)
    dataset = DatasetConfig(
        "prefix_repetition",
        builtin_text_path(),
        args.num_prompts,
        args.seed,
        prefix_repetition_prefix_len=args.prefix_len,
        prefix_repetition_suffix_len=args.suffix_len,
        prefix_repetition_num_prefixes=args.num_prefixes,
        prefix_repetition_output_len=args.output_len,
    )
    conversations = sample_conversations(dataset, load_tokenizer())
    sampling = SamplingConfig(BUILTIN_MODEL_NAME, "completions", 0.0, True)
    with Fleet(log_dir / setup.replace(" ", "-"), nodes, policy, "--no-spec") as fleet:
        before = fleet_counts(fleet)
        config = RunConfig(
            fleet.url, None, args.max_concurrency, args.request_rate, args.seed, 0, 600.0, None, False
        )
        result = asyncio.run(run_benchmark(config, conversations, sampling))
        counts = fleet_counts(fleet).minus(before)
        served = fleet.served()
    load = result.load
    ttft = load.ttft
    return (
        f"| {setup} | {len(load.ok)}/{len(conversations)} | {' / '.join(map(str, served))} | "
        f"{counts.hits}/{counts.queries} = {counts.hit_rate:.1%} | {ttft.mean:.0f} | {ttft.median:.0f} | "
        f"{ttft.p99:.0f} |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", nargs="+", default=[ALONE, *POLICIES], help=f"'{ALONE}' and/or policies")
    parser.add_argument("--num-prompts", type=int, default=60)
    parser.add_argument("--num-prefixes", type=int, default=6)
    parser.add_argument("--prefix-len", type=int, default=256)
    parser.add_argument("--suffix-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--max-concurrency", type=int, default=4)
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print("| setup | requests ok | served per node | fleet prefix-cache hits | TTFT mean ms | median | p99 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="router-fleet-") as folder:
        for setup in args.setups:
            print(run_setup(setup, args, Path(folder)), flush=True)


if __name__ == "__main__":
    main()
