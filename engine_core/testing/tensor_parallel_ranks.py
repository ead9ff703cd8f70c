"""N real rank processes joined by gloo on 127.0.0.1, for tests and benchmarks of the sharded model: each
runs a job with its `TensorParallel` and sends back what it returns. Bounded in time; every child is killed
by its pid on the way out, even when a rank fails or hangs."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.step_batch import SeqChunk, chunk_step

# A rank's job: called with the rank's TensorParallel and the run's arguments; returns something picklable.
RankJob = Callable[..., Any]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice for port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_ranks(job: RankJob, world_size: int, *args: Any, timeout_s: float = 120.0) -> list[Any]:
    """``job(TensorParallel(rank, world_size, group), *args)`` in ``world_size`` spawned processes joined by a
    gloo group; what each returns, in rank order. RuntimeError with the rank's traceback when a rank raises
    or dies, TimeoutError when they have not all answered within ``timeout_s``."""
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [
        context.Process(target=_rank_main, args=(job, rank, world_size, port, args, results), daemon=True)
        for rank in range(world_size)
    ]
    try:
        for process in ranks:
            process.start()
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(answers) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                dead = [p.exitcode for p in ranks if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a rank died (exit codes {dead}) before it answered") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world_size} ranks did not answer within {timeout_s} s") from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} of {world_size} failed:\n{value}")
            answers[rank] = value
        for process in ranks:
            process.join(timeout=max(1.0, deadline - time.monotonic()))
        return [answers[rank] for rank in range(world_size)]
    finally:
        for process in ranks:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
            process.join(timeout=10)
        results.close()


def _rank_main(
    job: RankJob, rank: int, world_size: int, port: int, args: Sequence[Any], results: Any
) -> None:
    torch.set_num_threads(1)  # N ranks share the machine's cores
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=60),
        )
        value = job(TensorParallel(rank, world_size, dist.group.WORLD), *args)
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 - any failure goes back to the parent, which raises it
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def runner_logits(
    parallel: TensorParallel,
    folder: Path,
    steps: Sequence[Sequence[SeqChunk]],
    num_kv_blocks: int,
    block_size: int,
    expert_parallel: bool = False,
) -> list[np.ndarray]:
    """A rank's job: a `ModelRunner` of ``folder`` on the CPU in float32 runs ``steps`` in order (each a
    step's chunks, over one KV cache); each step's logits (sum of num_logits, vocab) as numpy. With
    ``expert_parallel``, a MoE model's experts split whole over the ranks (--enable-expert-parallel)."""
    parallel = replace(parallel, expert_parallel=expert_parallel)
    runner = ModelRunner(
        folder, torch.device("cpu"), num_kv_blocks, block_size, dtype=torch.float32, parallel=parallel
    )
    logits = []
    for chunks in steps:
        logits.append(runner.execute(chunk_step(chunks, runner)).logits.numpy())
    return logits


def runner_greedy(
    parallel: TensorParallel,
    folder: Path,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    block_size: int = 4,
    expert_parallel: bool = False,
) -> list[list[int]]:
    """A rank's job: greedy decoding of ``prompts`` in one batch on a float32 `ModelRunner` of ``folder`` (the
    prompts prefilled in one step, then one token each a step). Every rank runs the same loop and takes the
    same argmax (the logits are gathered whole on every rank); each returns the batch's output tokens. A
    hybrid model's request i keeps its state in slot i."""
    parallel = replace(parallel, expert_parallel=expert_parallel)
    longest = max(len(p) for p in prompts) + max_tokens
    per_request = -(-longest // block_size)  # blocks a request can fill
    states = StateGeometry(len(prompts), 1)
    runner = ModelRunner(
        folder, torch.device("cpu"), len(prompts) * per_request, block_size, dtype=torch.float32,
        max_num_seqs=len(prompts), state_geometry=states, parallel=parallel,
    )  # fmt: skip
    hybrid = runner.state_geometry is not None
    tables = [list(range(i * per_request, (i + 1) * per_request)) for i in range(len(prompts))]
    chunks = [SeqChunk(list(p), 0, tables[i], 1, i if hybrid else None) for i, p in enumerate(prompts)]
    outputs: list[list[int]] = [[] for _ in prompts]
    for _ in range(max_tokens):
        logits = runner.execute(chunk_step(chunks, runner)).logits  # (requests, vocab)
        for i, token in enumerate(logits.argmax(dim=-1).tolist()):
            outputs[i].append(token)
        chunks = [
            SeqChunk([out[-1]], len(p) + len(out) - 1, tables[i], 1, i if hybrid else None)
            for i, (p, out) in enumerate(zip(prompts, outputs, strict=True))
        ]
    return outputs
