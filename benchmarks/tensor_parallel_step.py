"""A model step at one rank against two tensor-parallel CPU ranks (gloo), and what the collectives cost; not a
test.

    python -m openinfer.benchmarks.tensor_parallel_step [--rounds 8] [--iters 10] [--warmup 3]

``real_vocab_checkpoint`` (Qwen3-0.6B's widths and 151,936-token vocabulary, 2 layers) in float32, one torch
thread per process: N = 1 is one process running the whole model, N = 2 two ranks joined by gloo on
127.0.0.1 (`run_ranks`), each running its shard. Rank 0 also holds the N = 1 runner and runs it while rank 1
sleeps on a barrier, so the two alternate round by round (N = 1, N = 2, N = 1, ...) and the machine's drift
falls on both. Rows: a decode step of 1 and of 8 requests, each with ``--context-len`` tokens already in its
KV cache (prefilled once before timing; every timed step rewrites the same slot, so contexts stay put), and
one ``--prefill-len``-token prefill chunk from position 0. Each cell is the median over rounds x iterations
of rank 0's ``ModelRunner.execute``.

The collectives are timed by this benchmark alone: the N = 2 runners get a `TimedParallel`, a
`TensorParallel` whose ``all_reduce`` and ``all_gather_last`` add their time (rank 0's, waits for rank 1
included) and the bytes the rank sends to a clock. Bytes are counted as a ring moves them, per rank and per
direction: an all-reduce of B bytes 2(N-1)/N * B (B at N = 2), an all-gather (N-1) shards. A step makes
2 all-reduces of (tokens, hidden) per layer, one for the vocab-parallel embedding, and one all-gather of the
(logits, vocab / N) logits; the counted bytes are checked against that sum. "On paper" divides them by
NVLink 4's 450 GB/s per direction (H100): the bandwidth term alone, without each collective's latency.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from openinfer.benchmarks.model_step import timing_parser
from openinfer.benchmarks.real_vocab_checkpoint import real_vocab_checkpoint
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step
from openinfer.engine_core.testing.tensor_parallel_ranks import run_ranks
from openinfer.engine_core.worker.model_runner import ModelRunner

BLOCK_SIZE = 16
DECODE_BATCHES = (1, 8)
NVLINK_BYTES_PER_S = 450e9  # NVLink 4 (H100 SXM), each direction
WORLD_SIZE = 2
COLUMNS = ("N=1 ms", "N=2 ms", "speedup", "N=2 collective ms", "collective share", "bytes/step")


@dataclass
class CollectiveClock:
    """A rank's time inside its collectives and the bytes it sent (ring counts), added up since `reset`."""

    ns: int = 0
    bytes_sent: int = 0

    def observe(self, ns: int, bytes_sent: int) -> None:
        self.ns += ns
        self.bytes_sent += bytes_sent

    def reset(self) -> None:
        self.ns = 0
        self.bytes_sent = 0


@dataclass(frozen=True)
class TimedParallel(TensorParallel):
    """A `TensorParallel` whose two collectives report their time and bytes to ``clock`` (the benchmark's
    wrapper: the runtime never times itself)."""

    clock: CollectiveClock = field(default_factory=CollectiveClock, compare=False)

    def all_reduce(self, x: Tensor) -> Tensor:
        start = time.perf_counter_ns()
        y = super().all_reduce(x)
        ring = 2 * (self.world_size - 1) * x.nbytes // self.world_size  # reduce-scatter, then all-gather
        self.clock.observe(time.perf_counter_ns() - start, ring)
        return y

    def all_gather_last(self, x: Tensor) -> Tensor:
        start = time.perf_counter_ns()
        y = super().all_gather_last(x)
        self.clock.observe(time.perf_counter_ns() - start, (self.world_size - 1) * x.nbytes)
        return y


def step_collective_bytes(config: ModelConfig, tokens: int, logits: int, world: int) -> int:
    """Bytes one rank sends per step (float32, ring counts): the embedding's all-reduce and 2 per layer of
    (tokens, hidden), then the all-gather of (logits, vocab / world)."""
    reduced = (2 * config.num_hidden_layers + 1) * tokens * config.hidden_size * 4
    shard = logits * (config.vocab_size // world) * 4
    return 2 * (world - 1) * reduced // world + (world - 1) * shard


@dataclass(frozen=True)
class Plan:
    """What every rank runs (picklable: it travels to the spawned ranks)."""

    folder: Path
    context_len: int  # tokens in each decode request's KV cache
    prefill_len: int  # tokens of the one prefill chunk
    rounds: int  # N = 1 / N = 2 alternations
    iters: int  # timed decode steps per round
    prefill_iters: int  # timed prefills per round
    warmup: int  # untimed calls of each workload before the first round
    threads: int  # torch threads per process

    @property
    def rows(self) -> list[Row]:
        return [
            *(Row(f"decode b{b}", b, b, self.iters) for b in DECODE_BATCHES),
            Row(f"prefill {self.prefill_len}", self.prefill_len, 1, self.prefill_iters),
        ]


@dataclass(frozen=True)
class Row:
    """One row of the table: a step's shape and how often it is timed."""

    name: str
    tokens: int  # tokens the step runs
    logits: int  # rows of logits it computes
    iters: int  # timed calls per round


def run_chunks(runner: ModelRunner, chunks: list[SeqChunk]) -> object:
    return runner.execute(chunk_step(chunks, runner))


def workloads(runner: ModelRunner, plan: Plan) -> list[Callable[[], object]]:
    """A call per row of ``plan``, the decode rows' contexts prefilled first. Blocks: decode b1's, decode
    b8's, then the prefill's, disjoint; every call rewrites its own."""
    vocab = runner.model_config.vocab_size
    per_request = -(-(plan.context_len + 1) // BLOCK_SIZE)
    first = 0
    calls: list[Callable[[], object]] = []
    for batch in DECODE_BATCHES:
        tables = [list(range(first + b * per_request, first + (b + 1) * per_request)) for b in range(batch)]
        first += batch * per_request
        prompts = [[(7919 * b + 31 * i + 13) % vocab for i in range(plan.context_len)] for b in range(batch)]
        run_chunks(runner, [SeqChunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)])
        # each request's last prompt token again, at position context_len: one decode token a request
        decodes = [SeqChunk(p[-1:], plan.context_len, t) for p, t in zip(prompts, tables, strict=True)]
        calls.append(partial(run_chunks, runner, decodes))
    table = list(range(first, first + -(-plan.prefill_len // BLOCK_SIZE)))
    prompt = SeqChunk([(5 * i) % vocab for i in range(plan.prefill_len)], 0, table)
    calls.append(partial(run_chunks, runner, [prompt]))
    return calls


def num_blocks(plan: Plan) -> int:
    per_request = -(-(plan.context_len + 1) // BLOCK_SIZE)
    return sum(DECODE_BATCHES) * per_request + -(-plan.prefill_len // BLOCK_SIZE)


def time_round(
    calls: list[Callable[[], object]],
    rows: list[Row],
    clock: CollectiveClock | None,
    samples: dict[str, list[float]],
    n: int,
) -> None:
    """Each row's timed calls: ms appended to samples[f"{row} N={n}"] (and, with a clock, its ms and bytes
    to "{row} coll" and "{row} bytes")."""
    for row, call in zip(rows, calls, strict=True):
        for _ in range(row.iters):
            if clock is not None:
                clock.reset()
            start = time.perf_counter_ns()
            call()
            samples[f"{row.name} N={n}"].append((time.perf_counter_ns() - start) / 1e6)
            if clock is not None:
                samples[f"{row.name} coll"].append(clock.ns / 1e6)
                samples[f"{row.name} bytes"].append(clock.bytes_sent)


def rank_job(parallel: TensorParallel, plan: Plan, barrier: Any) -> dict[str, list[float]] | None:
    """A rank's part: its N = 2 runner (timed collectives) and, on rank 0, the N = 1 runner, alternating
    round by round; rank 0 returns every sample, rank 1 None."""
    torch.set_num_threads(plan.threads)
    timed = TimedParallel(parallel.rank, parallel.world_size, parallel.group)
    cpu = torch.device("cpu")
    sharded = workloads(
        ModelRunner(plan.folder, cpu, num_blocks(plan), BLOCK_SIZE, torch.float32, parallel=timed), plan
    )
    single = None
    if parallel.rank == 0:
        single = workloads(ModelRunner(plan.folder, cpu, num_blocks(plan), BLOCK_SIZE, torch.float32), plan)
    samples: dict[str, list[float]] = defaultdict(list)
    for calls in (single or [], sharded):  # rank 1 has no N = 1 calls: it waits at the barrier meanwhile
        barrier.wait()
        for call in calls:
            for _ in range(plan.warmup):
                call()
    for _ in range(plan.rounds):
        if single is not None:
            time_round(single, plan.rows, None, samples, 1)
        barrier.wait()
        time_round(sharded, plan.rows, timed.clock, samples, 2)
    return dict(samples) if parallel.rank == 0 else None


def report(plan: Plan, config: ModelConfig, samples: dict[str, list[float]]) -> list[str]:
    """The markdown table, then the on-paper lines."""
    lines = [
        "| step | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    paper = []
    for row in plan.rows:
        one, two = (statistics.median(samples[f"{row.name} N={n}"]) for n in (1, 2))
        coll = statistics.median(samples[f"{row.name} coll"])
        counted = {int(b) for b in samples[f"{row.name} bytes"]}
        expected = step_collective_bytes(config, row.tokens, row.logits, WORLD_SIZE)
        if counted != {expected}:
            raise RuntimeError(
                f"{row.name}: the collectives sent {counted} bytes a step, the count says {expected}"
            )
        cells = (
            f"{one:.2f}",
            f"{two:.2f}",
            f"{one / two:.2f}x",
            f"{coll:.2f}",
            f"{coll / two:.0%}",
            f"{expected:,}",
        )
        lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
        paper.append(
            f"- {row.name}: {expected / 1e6:.2f} MB in {expected / NVLINK_BYTES_PER_S * 1e6:.1f} us,"
            f" against {coll:.2f} ms in gloo here"
        )
    lines += [
        "",
        f"On paper, at NVLink 4's {NVLINK_BYTES_PER_S / 1e9:.0f} GB/s per direction (H100), a rank sends and"
        " receives a step's bytes in:",
        *paper,
        f"That is the bandwidth term alone: a step makes {2 * config.num_hidden_layers + 2} collectives, and at"
        " decode sizes their per-call latency, not their bytes, sets the time.",
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = timing_parser(__doc__ or "", warmup=3, iters=10, longer="--prefill-iters")
    parser.add_argument(
        "--model", type=Path, default=None, help="Qwen3 dense folder (default: real_vocab_checkpoint)"
    )
    parser.add_argument("--rounds", type=int, default=8, help="N = 1 / N = 2 alternations")
    parser.add_argument("--prefill-iters", type=int, default=1, help="timed prefills per round")
    parser.add_argument("--context-len", type=int, default=128, help="tokens cached per decode request")
    parser.add_argument("--prefill-len", type=int, default=1500, help="tokens of the prefill chunk")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="bound on the whole run")
    args = parser.parse_args(argv)
    folder = args.model or real_vocab_checkpoint()
    plan = Plan(
        folder, args.context_len, args.prefill_len, args.rounds, args.iters, args.prefill_iters,
        args.warmup, args.num_threads,
    )  # fmt: skip
    barrier = multiprocessing.get_context("spawn").Barrier(WORLD_SIZE)
    samples = run_ranks(rank_job, WORLD_SIZE, plan, barrier, timeout_s=args.timeout_s)[0]
    print(
        f"model {folder.name} on cpu, float32, {plan.threads} thread(s) per process; N = 2: gloo on 127.0.0.1;"
        f" ms per ModelRunner.execute on rank 0, median of {plan.rounds} alternating rounds x {plan.iters}"
        f" decode steps ({plan.prefill_iters} prefill); decode contexts {plan.context_len} tokens;"
        " bytes/step: what each rank sends (and receives) per step\n"
    )
    print("\n".join(report(plan, ModelConfig.from_folder(folder), samples)))


if __name__ == "__main__":
    main()
