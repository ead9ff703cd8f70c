"""Eager against compiled (``-O3``: torch.compile, inductor, frozen weights) model steps; not a test.

    python -m openinfer.benchmarks.compiled_step [--model DIR] [--threads 1] [--rounds 3]

On the real-vocabulary Qwen3-0.6B-shaped checkpoint (benchmarks/real_vocab_checkpoint.py) by default: the
median milliseconds of a decode step at batch 1 and 8 (one token each, 64-token contexts, logits included)
and of a 100- and a 1,500-token prefill, per token for the prefills, each runner built in a process of its
own and the two levels interleaved round by round (this VM's speed moves between minutes). Also the time to
the first compiled step with an empty cache folder (cold) and with the folder the cold run filled (cached),
each in a fresh process. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from openinfer.benchmarks.model_step import decode_step, median_ms, prefill_step
from openinfer.benchmarks.real_vocab_checkpoint import real_vocab_checkpoint
from openinfer.engine_core.compilation_config import CompilationConfig
from openinfer.engine_core.worker.model_runner import ModelRunner

WORKLOADS = ("decode b1", "decode b8", "prefill 100 (per token)", "prefill 1500 (per token)")
NUM_BLOCKS = 160  # 8 decode requests of 64 tokens, or one 1,500-token prompt, in blocks of 16


def measure(model: Path, level: int, cache_dir: str, threads: int) -> dict[str, float]:
    """One process's job: build the runner at ``level`` and time each workload; ``start`` is the seconds from
    the runner's construction to its first step's end (the compile, cold or cached, at level > 0)."""
    torch.set_num_threads(threads)
    started = time.perf_counter()
    config = CompilationConfig(level=level, cache_dir=cache_dir)
    runner = ModelRunner(model, torch.device("cpu"), NUM_BLOCKS, 16, torch.float32, compilation=config)
    prefill = {length: prefill_step(runner, length) for length in (100, 1500)}
    prefill[100]()
    result = {"start": time.perf_counter() - started}
    result["decode b1"] = median_ms(decode_step(runner, 1), 5, 20)
    result["decode b8"] = median_ms(decode_step(runner, 8), 5, 20)
    result["prefill 100 (per token)"] = median_ms(prefill[100], 3, 10) / 100
    result["prefill 1500 (per token)"] = median_ms(prefill[1500], 1, 3) / 1500
    return result


def in_process(model: Path, level: int, cache_dir: str, threads: int) -> dict[str, float]:
    """:func:`measure` in a fresh interpreter (nothing compiled or cached in memory)."""
    code = (
        "import json, sys; from pathlib import Path; from openinfer.benchmarks.compiled_step import measure; "
        f"print(json.dumps(measure(Path({str(model)!r}), {level}, {cache_dir!r}, {threads})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a Qwen3 folder (default: the real-vocabulary checkpoint)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    model = args.model or real_vocab_checkpoint()
    samples: dict[int, list[dict[str, float]]] = {0: [], 3: []}
    with tempfile.TemporaryDirectory(prefix="compiled-step-") as cache:
        starts = {"cold": in_process(model, 3, cache, args.threads)["start"]}
        for _ in range(args.rounds):  # interleaved: eager, compiled (cached), eager, ...
            for level in samples:
                samples[level].append(in_process(model, level, cache, args.threads))
        starts["cached"] = statistics.median(s["start"] for s in samples[3])
        starts["eager"] = statistics.median(s["start"] for s in samples[0])
    print(f"| workload ({model.name}, {args.threads} thread) | eager ms | compiled ms | eager / compiled |")
    print("| --- | --- | --- | --- |")
    for workload in WORKLOADS:
        eager, compiled = (statistics.median(s[workload] for s in samples[level]) for level in (0, 3))
        print(f"| {workload} | {eager:.3f} | {compiled:.3f} | {eager / compiled:.2f}x |")
    print(
        f"| start to first step, s | eager {starts['eager']:.1f} | cold {starts['cold']:.1f}, "
        f"cached {starts['cached']:.1f} | |"
    )


if __name__ == "__main__":
    main()
