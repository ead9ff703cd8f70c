"""Latency of one `ModelRunner.execute` on the built-in model (CPU, or `--device cuda`); not a test.

Prints one markdown table, a row per workload and a column per thread count, each cell the median
milliseconds of `--iters` timed calls after `--warmup` untimed ones:

    python benchmarks/model_step.py --threads 1 2

Decode rows run one new token for each of B requests whose prompts (64 tokens, less b % 8 for request b,
so that contexts differ as in serving) were prefilled first; every timed call rewrites the same slots, so
the contexts stay put. The prefill row runs one 256-token prompt from position 0. A hybrid model's (Qwen3.5's)
request b keeps its state in slot b, the prefill's in slot 0 (`hybrid_step.py` times those). `--profile` also
prints torch.profiler's table of aten ops for one batch-1 decode step (op counts and self CPU time).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.engine_core.config import ModelDtype
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step, decoding_requests, step_of_chunks
from openinfer.engine_core.worker.executor import resolve_dtype
from openinfer.engine_core.worker.input_batch import InputBatch
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.kernels.backend_name import BackendName

BLOCK_SIZE = 16
CONTEXT_LEN = 64  # most tokens already cached per decode request
PREFILL_LEN = 256
DECODE_BATCHES = (1, 8, 32)


def decode_step(runner: ModelRunner, batch: int) -> Callable[[], object]:
    """Prefill `batch` prompts of CONTEXT_LEN - b % 8 tokens; return a call decoding one token for each. A hybrid
    model's runner needs `batch` state groups: request b reads and rewrites slot b."""
    blocks_per_request = -(-(CONTEXT_LEN + 1) // BLOCK_SIZE)
    tables = [list(range(b * blocks_per_request, (b + 1) * blocks_per_request)) for b in range(batch)]
    vocab = runner.model_config.vocab_size
    prompts = [[(7 * b + 3 * i) % vocab for i in range(CONTEXT_LEN - b % 8)] for b in range(batch)]
    slots = list(range(batch)) if runner.state_geometry is not None else [None] * batch
    chunks = [SeqChunk(p, 0, t, state_slot=s) for p, t, s in zip(prompts, tables, slots, strict=True)]
    runner.execute(chunk_step(chunks, runner))
    if runner.state_geometry is not None:
        # InputBatch finds a request's state from the chunk its row ran last, so it cannot replay one decode
        # step; the step is built from chunks instead, each call (a few numpy operations either way).
        decodes = [
            SeqChunk(c.token_ids[-1:], len(c.token_ids), c.block_ids, state_slot=c.state_slot) for c in chunks
        ]
        return lambda: runner.execute(step_of_chunks(decodes, BLOCK_SIZE))
    # Each decode step's inputs are gathered as the engine gathers them: from the input batch's rows.
    scheduled = decoding_requests([[*p, p[-1]] for p in prompts], tables)
    rows = InputBatch(batch, CONTEXT_LEN + 1, BLOCK_SIZE)
    return lambda: runner.execute(rows.step_of(scheduled))


def prefill_step(runner: ModelRunner, length: int = PREFILL_LEN) -> Callable[[], object]:
    """One `length`-token prompt from position 0 (a hybrid model's state kept in slot 0)."""
    table = list(range(-(-length // BLOCK_SIZE)))
    slot = 0 if runner.state_geometry is not None else None
    chunk = SeqChunk(
        [(5 * i) % runner.model_config.vocab_size for i in range(length)], 0, table, state_slot=slot
    )
    return lambda: runner.execute(chunk_step([chunk], runner))


def median_ms(step: Callable[[], object], warmup: int, iters: int) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        sync()
        start = time.perf_counter()
        step()
        sync()  # a CUDA step is done when its kernels are, not when Python returns
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def timing_parser(description: str, warmup: int, iters: int, longer: str) -> argparse.ArgumentParser:
    """The flags of a benchmark that times steps on the CPU: --num-threads (torch's; the caller sets it),
    --warmup and --iters (`longer`: the share of --iters its long steps are timed)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--iters", type=int, default=iters, help=f"timed calls per cell (prefill: {longer})")
    return parser


def profile(step: Callable[[], object], warmup: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(warmup):
        step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    ops = prof.key_averages()
    print(f"\naten ops in one batch-1 decode step: {sum(e.count for e in ops if e.key.startswith('aten::'))}")
    print(ops.table(sort_by="self_cpu_time_total", row_limit=25))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=None, help="Qwen3 folder (default: the built-in model)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch.set_num_threads values")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=200, help="timed calls per cell (prefill: a tenth)")
    parser.add_argument("--profile", action="store_true", help="also print the aten ops of one decode step")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", choices=list(ModelDtype))
    parser.add_argument("--attention-backend", default="auto", choices=list(BackendName))
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for the decode rows")
    args = parser.parse_args()

    model = args.model or builtin_target_folder()
    num_blocks = max(DECODE_BATCHES) * -(-(CONTEXT_LEN + 1) // BLOCK_SIZE) + PREFILL_LEN // BLOCK_SIZE
    device = torch.device(args.device)
    dtype = resolve_dtype(ModelDtype(args.dtype), device)
    runner = ModelRunner(
        model, device, num_blocks, BLOCK_SIZE, dtype, args.attention_backend, args.enforce_eager
    )
    workloads: list[tuple[str, Callable[[], object], int]] = [
        (f"decode B={b}, ctx ~{CONTEXT_LEN}", decode_step(runner, b), args.iters) for b in DECODE_BATCHES
    ]
    workloads.append((f"prefill {PREFILL_LEN}", prefill_step(runner), max(1, args.iters // 10)))

    results: dict[tuple[str, int], float] = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, step, iters in workloads:
            results[name, threads] = median_ms(step, args.warmup, iters)

    backend = type(runner.attn_backend).__name__ + (", CUDA graphs" if runner.step_graphs else "")
    print(f"model {model.name} on {args.device} in {args.dtype} ({backend}), ms per execute (median)\n")
    print("| workload | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in args.threads) + " |")
    print("|---|" + "---:|" * len(args.threads))
    for name, _, _ in workloads:
        print(f"| {name} | " + " | ".join(f"{results[name, t]:.2f}" for t in args.threads) + " |")
    if args.profile:
        torch.set_num_threads(args.threads[0])
        profile(workloads[0][1], args.warmup)


if __name__ == "__main__":
    main()
