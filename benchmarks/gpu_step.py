"""Decode-step time on CUDA against the HBM floor, eager and from CUDA graphs; not a test.

    python benchmarks/gpu_step.py [--model DIR | --qwen3-4b DIR | --qwen3-5-4b DIR] [--batch-sizes 1 8 64]
        [--context 512]

``--qwen3-4b DIR`` writes (once) a random bfloat16 checkpoint shaped like Qwen3-4B (36 layers, hidden 2560,
32 query and 8 KV heads of 128, MLP 9728, vocabulary 151,936) and times it; ``--qwen3-5-4b DIR`` one shaped
like Qwen3.5-4B (32 layers, 24 Gated DeltaNet and 8 gated full attention; hidden 2560, 16 query and 4 KV heads
of 256, MLP 9216, DeltaNet 16 key and 32 value heads of 128, vocabulary 248,320), whose floor also reads and
writes each request's float32 recurrent state once per DeltaNet layer. Each row: B requests with
``--context`` tokens cached decode one token each. The floor is the bytes one step must read from HBM (every
weight once, the LM head included, and each request's keys and values) divided by the copy bandwidth
measured first (bytes read + written per second by a large device-to-device copy).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from openinfer.engine_core.core.kv_sizing import state_slot_bytes
from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step, decoding_requests
from openinfer.engine_core.worker.input_batch import InputBatch
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.step_batch import StepBatch

QWEN3_4B = {
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}
# Qwen3.5-4B's text model (transformers' Qwen3_5TextConfig arguments; full attention every 4th layer)
QWEN3_5_4B = {
    "vocab_size": 248320,
    "hidden_size": 2560,
    "intermediate_size": 9216,
    "num_hidden_layers": 32,
    "layer_types": None,
    "full_attention_interval": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
}
BLOCK_SIZE = 16


def copy_bandwidth(device: torch.device, num_bytes: int = 2 << 30) -> float:
    """Bytes read + written per second by a device-to-device copy of ``num_bytes``."""
    source = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        target.copy_(source)
    torch.cuda.synchronize()
    return 2 * num_bytes * 10 / (time.perf_counter() - start)


def decode_ms(runner: ModelRunner, batch: int, context: int, iters: int) -> float:
    """Median ms of one decode step of ``batch`` requests with ``context`` cached tokens each."""
    per_request = -(-(context + 1) // BLOCK_SIZE)
    tables = [list(range(b * per_request, (b + 1) * per_request)) for b in range(batch)]
    vocab = runner.model_config.vocab_size
    prompts = [[(7 * b + 3 * i) % vocab for i in range(context)] for b in range(batch)]
    hybrid = runner.state_geometry is not None  # Qwen3.5: request b's state in slot b
    for b in range(batch):  # prefill one request at a time: bounded activation memory
        slot = b if hybrid else None
        runner.execute(chunk_step([SeqChunk(prompts[b], 0, tables[b], state_slot=slot)], runner))
    if hybrid:  # the same decode step again and again, each from the state the last one stored
        chunks = [SeqChunk([prompts[b][-1]], context, tables[b], state_slot=b) for b in range(batch)]
        fixed = chunk_step(chunks, runner)
        steps: Iterator[StepBatch] = itertools.repeat(fixed)
    else:  # gathered as the engine gathers a decode step: from the input batch's rows
        scheduled = decoding_requests([[*p, p[-1]] for p in prompts], tables)
        rows = InputBatch(batch, context + 1, BLOCK_SIZE)
        steps = (rows.step_of(scheduled) for _ in itertools.count())
    for _ in range(5):
        runner.execute(next(steps))  # the first graph replay of this shape captures it
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        runner.execute(next(steps))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def make_once(folder: Path, hybrid: bool) -> None:
    """Write the random Qwen3-4B- or Qwen3.5-4B-shaped checkpoint into ``folder`` unless it is there
    (written to a side folder first: a killed run leaves none)."""
    if (folder / "config.json").is_file():
        return
    partial = folder.with_name(folder.name + ".partial")
    if hybrid:
        from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint

        make_tiny_qwen3_5_checkpoint(
            partial, init_std=0.02, overrides=QWEN3_5_4B, dtype=torch.bfloat16, layout="causal_lm"
        )
    else:
        from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint

        make_tiny_checkpoint(partial, init_std=0.02, overrides=QWEN3_4B, dtype=torch.bfloat16)
    partial.rename(folder)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model", type=Path, help="a Qwen3 folder")
    where.add_argument("--qwen3-4b", type=Path, metavar="DIR", help="make (once) and time a random Qwen3-4B")
    where.add_argument(
        "--qwen3-5-4b", type=Path, metavar="DIR", help="make (once) and time a random Qwen3.5-4B"
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--context", type=int, default=512, help="cached tokens per request")
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_step.py: no CUDA device", file=sys.stderr)
        return 2
    folder = args.model or args.qwen3_4b or args.qwen3_5_4b
    if args.model is None:
        make_once(folder, hybrid=args.qwen3_5_4b is not None)
    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device)
    num_blocks = max(args.batch_sizes) * -(-(args.context + 1) // BLOCK_SIZE)
    print(f"{folder.name}: copy bandwidth {bandwidth / 1e12:.2f} TB/s; context {args.context} tokens\n")
    print("| batch | step | HBM floor (ms) | ms per step | / floor |")
    print("|---:|---|---:|---:|---:|", flush=True)
    for eager in (True, False):
        states = StateGeometry(max(args.batch_sizes), 1)  # used by a Qwen3.5 folder only
        runner = ModelRunner(
            folder, device, num_blocks, BLOCK_SIZE, torch.bfloat16, enforce_eager=eager, state_geometry=states
        )
        config = runner.model_config
        weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
        kv_bytes_per_token = 2 * config.num_kv_layers * config.kv_width * 2  # keys and values, bfloat16
        state_bytes = 2 * state_slot_bytes(config, torch.bfloat16)  # read and written: one slot a request
        for batch in args.batch_sizes:
            ms = decode_ms(runner, batch, args.context, args.iters)
            moved = weight_bytes + batch * ((args.context + 1) * kv_bytes_per_token + state_bytes)
            floor = moved / bandwidth * 1e3
            mode = "eager" if eager else "CUDA graphs"
            print(f"| {batch} | {mode} | {floor:.2f} | {ms:.2f} | {ms / floor:.2f}x |", flush=True)
        del runner
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
