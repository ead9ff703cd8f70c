"""A prefill chunk's attention on the CPU, torch's flash kernel against the oneDNN blocks; not a test.

    python benchmarks/cpu_chunk_attention.py      # float32, 1 thread, Qwen3-0.6B's heads (16/8, head_dim 128)

Prints one markdown table: per (context before the chunk, chunk length) the median milliseconds of one
layer's `flash_chunk_attention` and `onednn_chunk_attention` (kernels/cpu_chunk_attention.py) and which one
`chunk_attention` takes on this CPU (the probe's answer; the flash kernel below its size thresholds).
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from openinfer.benchmarks.model_step import median_ms
from openinfer.kernels.cpu_chunk_attention import flash_chunk_attention, onednn_chunk_attention, takes_onednn

# (context tokens before the chunk, chunk tokens): a whole prompt, and the 512-token chunks of a long one
CASES = ((0, 64), (0, 128), (0, 512), (0, 1500), (512, 512), (1024, 512), (1536, 512), (3584, 512))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"float32, {args.threads} thread(s), CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print("| context | chunk | flash ms | oneDNN ms | flash / oneDNN | chunk_attention takes |")
    print("|---:|---:|---:|---:|---:|---|")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for context_len, num_queries in CASES:
            q = torch.randn(num_queries, 16, 128, generator=g)  # (Q, H, D)
            keys, values = torch.randn(2, context_len + num_queries, 8, 128, generator=g)  # (S, Hkv, D) each
            flash_ms, onednn_ms = (
                median_ms(partial(call, q, keys, values, context_len, 128**-0.5), 1, args.iters)
                for call in (flash_chunk_attention, onednn_chunk_attention)
            )
            takes = (
                "oneDNN" if takes_onednn(num_queries, context_len + num_queries, torch.float32) else "flash"
            )
            print(
                f"| {context_len} | {num_queries} | {flash_ms:.2f} | {onednn_ms:.2f} "
                f"| {flash_ms / onednn_ms:.2f}x | {takes} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
