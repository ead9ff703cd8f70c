"""Decode-step time on CUDA against the HBM floor, eager and from CUDA graphs; not a test.

    python benchmarks/gpu_step.py [--model DIR | --qwen3-4b DIR] [--batch-sizes 1 8 64] [--context 512]

``--qwen3-4b DIR`` writes (once) a random bfloat16 checkpoint shaped like Qwen3-4B (36 layers, hidden 2560,
32 query and 8 KV heads of 128, MLP 9728, vocabulary 151,936) and times it. Each row: B requests with
``--context`` tokens cached decode one token each. The floor is the bytes one step must read from HBM (every
weight once, the LM head included, and each request's keys and values) divided by the copy bandwidth
measured first (bytes read + written per second by a large device-to-device copy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step, decoding_requests
from openinfer.engine_core.worker.input_batch import InputBatch
from openinfer.engine_core.worker.model_runner import ModelRunner

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
    for b in range(batch):  # prefill one request at a time: bounded activation memory
        runner.execute(chunk_step([SeqChunk(prompts[b], 0, tables[b])], runner))
    # Each decode step's inputs are gathered as the engine gathers them: from the input batch's rows.
    scheduled = decoding_requests([[*p, p[-1]] for p in prompts], tables)
    rows = InputBatch(batch, context + 1, BLOCK_SIZE)
    for _ in range(5):
        runner.execute(rows.step_of(scheduled))  # the first graph replay of this shape captures it
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        runner.execute(rows.step_of(scheduled))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model", type=Path, help="a Qwen3 folder")
    where.add_argument("--qwen3-4b", type=Path, metavar="DIR", help="make (once) and time a random Qwen3-4B")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--context", type=int, default=512, help="cached tokens per request")
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_step.py: no CUDA device", file=sys.stderr)
        return 2
    folder = args.model
    if args.qwen3_4b is not None:
        folder = args.qwen3_4b
        if not (folder / "config.json").is_file():  # written to a side folder first: a killed run leaves none
            from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint

            partial = folder.with_name(folder.name + ".partial")
            make_tiny_checkpoint(partial, init_std=0.02, overrides=QWEN3_4B, dtype=torch.bfloat16)
            partial.rename(folder)
    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device)
    num_blocks = max(args.batch_sizes) * -(-(args.context + 1) // BLOCK_SIZE)
    print(f"{folder.name}: copy bandwidth {bandwidth / 1e12:.2f} TB/s; context {args.context} tokens\n")
    print("| batch | step | HBM floor (ms) | ms per step | / floor |")
    print("|---:|---|---:|---:|---:|", flush=True)
    for eager in (True, False):
        runner = ModelRunner(folder, device, num_blocks, BLOCK_SIZE, torch.bfloat16, enforce_eager=eager)
        config = runner.model_config
        weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
        kv_bytes_per_token = 2 * config.num_hidden_layers * config.kv_width * 2  # keys and values, bfloat16
        for batch in args.batch_sizes:
            ms = decode_ms(runner, batch, args.context, args.iters)
            floor = (weight_bytes + batch * (args.context + 1) * kv_bytes_per_token) / bandwidth * 1e3
            mode = "eager" if eager else "CUDA graphs"
            print(f"| {batch} | {mode} | {floor:.2f} | {ms:.2f} | {ms / floor:.2f}x |", flush=True)
        del runner
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
