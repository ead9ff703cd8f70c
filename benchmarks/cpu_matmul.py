"""A weight matmul on the CPU three ways, at the shapes of a Qwen3-0.6B step; not a test.

    python benchmarks/cpu_matmul.py                 # float32, 1 thread, rows 1 2 8 64 512
    python benchmarks/cpu_matmul.py --dtype bfloat16

Prints one markdown table: per (weight, rows) the median milliseconds of `F.linear` by the checkpoint's
(out, in) matrix, `torch.mm` by its row-major transpose (what `PackedLinear` and `VocabMatrix` held before
oneDNN), and `packed_matmul` by oneDNN's packed copy (kernels/cpu_matmul.py, what the CPU engine runs now),
and the bandwidth the packed matmul reaches (weight bytes / time: the decode rows are bound by it).
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.nn.functional as F

from openinfer.benchmarks.model_step import median_ms
from openinfer.kernels.cpu_matmul import cpu_packing_available, pack_weight, packed_matmul

# (name, out_features, in_features): Qwen3-0.6B's projections (q/k/v and gate/up packed as the engine packs
# them) and its 151,936-token LM head
WEIGHTS = (
    ("qkv_proj", 4096, 1024),
    ("o_proj", 1024, 2048),
    ("gate_up_proj", 6144, 1024),
    ("down_proj", 1024, 3072),
    ("lm_head", 151936, 1024),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 8, 64, 512])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if not cpu_packing_available(dtype):
        raise SystemExit(f"this torch build or CPU has no oneDNN {args.dtype} matmul")
    print(f"{args.dtype}, {args.threads} thread(s), CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(
        "| weight | rows | F.linear ms | mm by transpose ms | oneDNN packed ms | linear / packed | packed GB/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, out_features, in_features in WEIGHTS:
            weight = torch.randn(out_features, in_features, generator=g).to(dtype)  # (out, in)
            transposed = weight.t().contiguous()  # (in, out) row-major
            packed = pack_weight(weight).matrix
            iters = max(3, args.iters // 4) if out_features > 100_000 else args.iters
            for rows in args.rows:
                if out_features > 100_000 and rows > 64:
                    continue  # the head runs only for the rows that sample
                x = torch.randn(rows, in_features, generator=g).to(dtype)
                linear_ms, mm_ms, packed_ms = (
                    median_ms(call, 2, iters)
                    for call in (
                        partial(F.linear, x, weight),
                        partial(torch.mm, x, transposed),
                        partial(packed_matmul, x, packed),
                    )
                )
                gbps = weight.numel() * weight.element_size() / packed_ms / 1e6
                print(
                    f"| {name} | {rows} | {linear_ms:.2f} | {mm_ms:.2f} | {packed_ms:.2f} "
                    f"| {linear_ms / packed_ms:.2f}x | {gbps:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
