"""The Triton fused-MoE kernel on a Qwen3-30B-A3B-shaped layer against its memory floor and the torch grouped
path; not a test.

    python benchmarks/moe_kernel.py [--num-tokens 1 8 32 64 256 2048] [--iters 20]

One MoE layer: hidden 2048, 128 experts of intermediate 768, top-8, bfloat16, random weights and a uniform
random top-8 routing per token (decode batches 1/8/32/64, prefill 256/2048 tokens). The floor is the bytes the
step must read or write (the weights of the experts the routing picks, once each, and the hidden states in
and out) divided by the copy bandwidth measured first. Columns: fused_experts_triton eager and replayed from
a CUDA graph, and the torch grouped path (openinfer.kernels.moe.grouped_experts, the CPU's: one gate/up and
one down matmul per routed expert; it reads the per-expert counts on the host, so it is eager only). Without
CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from openinfer.benchmarks.gpu_step import copy_bandwidth
from openinfer.kernels.moe import grouped_experts
from openinfer.kernels.triton_moe import fused_experts_triton

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8  # Qwen3-30B-A3B


def median_ms(fn: Callable[[], object], iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def graph_ms(inputs: list[Tensor], iters: int) -> float:
    """fused_experts_triton captured once in a CUDA graph (after a warm-up that compiles it), then replayed."""
    fused_experts_triton(*inputs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_experts_triton(*inputs)
    return median_ms(graph.replay, iters)


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the table; exit status 0, without CUDA too."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-tokens", type=int, nargs="+", default=[1, 8, 32, 64, 256, 2048])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_kernel.py needs CUDA (torch.cuda.is_available() is false); nothing timed")
        return 0
    device, dtype = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=device).manual_seed(0)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g, device=device, dtype=dtype) / HIDDEN**0.5
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=g, device=device, dtype=dtype) / INTER**0.5
    expert_bytes = (w13[0].numel() + w2[0].numel()) * w13.element_size()
    bandwidth = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(f"H {HIDDEN}, I {INTER}, {EXPERTS} experts, top-{TOP_K}, bf16\n")
    print("| tokens | experts routed | floor (ms) | triton (ms) | / floor ", end="")
    print("| triton graph (ms) | / floor | torch grouped (ms) | grouped / graph |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tokens in args.num_tokens:
        hidden = torch.randn(tokens, HIDDEN, generator=g, device=device, dtype=dtype)
        scores = torch.rand(tokens, EXPERTS, generator=g, device=device)
        topk_weights, topk_ids = scores.topk(TOP_K, dim=1)  # (T, k): distinct experts per token
        topk_weights = topk_weights / topk_weights.sum(1, keepdim=True)
        inputs = [hidden, w13, w2, topk_weights, topk_ids]
        routed = topk_ids.unique().numel()
        floor = (routed * expert_bytes + 2 * hidden.numel() * hidden.element_size()) / bandwidth * 1e3
        eager = median_ms(partial(fused_experts_triton, *inputs), args.iters)
        replay = graph_ms(inputs, args.iters)
        grouped = median_ms(partial(grouped_experts, *inputs), args.iters)
        row = [tokens, routed, f"{floor:.3f}", f"{eager:.3f}", f"{eager / floor:.1f}x"]
        row += [f"{replay:.3f}", f"{replay / floor:.1f}x", f"{grouped:.3f}", f"{grouped / replay:.1f}x"]
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
