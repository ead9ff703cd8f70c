"""One engine step of a tiny-but-not-trivial Qwen3-MoE checkpoint against a dense Qwen3 of the same active
size, and kernels/moe.py's grouped experts against loops over experts and over tokens (CPU); not a test.

    python benchmarks/moe_step.py --num-threads 1

The MoE model is the built-in model's architecture (4 layers, hidden 256, vocabulary 512) with 32 experts of
width 192 on every layer, top-4: 4 * 192 = 768 active MLP columns per token, the dense model's
intermediate_size, so both do the same MLP arithmetic per token (the router's 32 x 256 aside); the MoE model
holds 8x the MLP weights. Steps are `model_step.py`'s: decode of B requests at ~64 tokens of context, and a
256-token prefill; each cell the median milliseconds of `--iters` calls (prefill: a tenth). The kernel tables
time one layer's experts: the tiny model's, and a Qwen3-30B-A3B-shaped layer's in float32, the CPU's dtype
(128 experts of 768 over hidden 2048, top-8; `moe_kernel.py` times the same layer on CUDA in bfloat16).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from openinfer.benchmarks.model_step import (
    BLOCK_SIZE,
    CONTEXT_LEN,
    DECODE_BATCHES,
    PREFILL_LEN,
    decode_step,
    median_ms,
    prefill_step,
    timing_parser,
)
from openinfer.benchmarks.moe_kernel import EXPERTS, HIDDEN, INTER, TOP_K
from openinfer.engine_core.testing.qwen3_moe_checkpoint import make_tiny_moe_checkpoint
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.kernels.moe import grouped_experts, naive_experts

# The built-in architecture, every layer sparse: 32 experts of 192, top-4 (768 active = the dense 768).
MOE = {
    "hidden_size": 256, "num_hidden_layers": 4, "head_dim": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 192,
    "norm_topk_prob": True,
}  # fmt: skip
KERNEL_TOKENS = (1, 8, 32, 256)
A3B_TOKENS = (1, 8, 64)  # a Qwen3-30B-A3B-shaped layer: decode of 1 and 8, a 64-token chunk


def all_experts_loop(
    hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor
) -> Tensor:
    """The experts as a loop over every expert (transformers 4's form): each one masks out its tokens,
    whether or not any token picked it."""
    out = torch.zeros(hidden.shape, dtype=torch.float32)
    for expert in range(w13.shape[0]):
        token, choice = torch.where(topk_ids == expert)  # (n,) each; n may be 0
        gate, up = F.linear(hidden[token], w13[expert]).chunk(2, dim=-1)
        down = F.linear(F.silu(gate) * up, w2[expert]).float() * topk_weights[token, choice, None]
        out.index_add_(0, token, down)
    return out.to(hidden.dtype)


def step_rows(folder: Path, warmup: int, iters: int) -> dict[str, float]:
    num_blocks = max(DECODE_BATCHES) * -(-(CONTEXT_LEN + 1) // BLOCK_SIZE) + PREFILL_LEN // BLOCK_SIZE
    runner = ModelRunner(folder, torch.device("cpu"), num_blocks, BLOCK_SIZE, torch.float32)
    rows = {f"decode B={b}": median_ms(decode_step(runner, b), warmup, iters) for b in DECODE_BATCHES}
    rows[f"prefill {PREFILL_LEN}"] = median_ms(prefill_step(runner), warmup // 4, max(1, iters // 10))
    return rows


@dataclass(frozen=True)
class ExpertShape:
    """One MoE layer's experts: E experts of width I over hidden H, top-k, in a dtype."""

    experts: int
    hidden: int
    width: int
    top_k: int
    dtype: torch.dtype

    def __str__(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        return f"H {self.hidden}, {self.experts} x {self.width}, top-{self.top_k}, {name}"


TINY_LAYER = ExpertShape(
    MOE["num_experts"], MOE["hidden_size"], MOE["moe_intermediate_size"], 4, torch.float32
)
A3B_LAYER = ExpertShape(EXPERTS, HIDDEN, INTER, TOP_K, torch.float32)  # Qwen3-30B-A3B's (2.4 GB a layer)


def kernel_rows(
    shape: ExpertShape, token_counts: tuple[int, ...], warmup: int, iters: int
) -> dict[str, tuple[float, float, float]]:
    """Per token count: ms of the grouped path, the all-experts loop and the per-token loop (one MoE layer)."""
    g = torch.Generator().manual_seed(0)
    w13 = (torch.randn(shape.experts, 2 * shape.width, shape.hidden, generator=g) * 0.05).to(shape.dtype)
    w2 = (torch.randn(shape.experts, shape.hidden, shape.width, generator=g) * 0.05).to(shape.dtype)
    rows: dict[str, tuple[float, float, float]] = {}
    for tokens in token_counts:
        x = torch.randn(tokens, shape.hidden, generator=g).to(shape.dtype)
        weights, ids = torch.rand(tokens, shape.experts, generator=g).softmax(-1).topk(shape.top_k, dim=-1)
        args = (x, w13, w2, weights, ids)
        grouped, loop, naive = (
            median_ms(partial(path, *args), warmup, iters)
            for path in (grouped_experts, all_experts_loop, naive_experts)
        )
        rows[f"T={tokens}"] = (grouped, loop, naive)
    return rows


def print_kernel_table(shape: ExpertShape, token_counts: tuple[int, ...], warmup: int, iters: int) -> None:
    print(f"\nkernels/moe.py, one layer's experts ({shape}), ms (median)\n")
    print(
        "| tokens | grouped (experts routed) | loop over all experts | loop over tokens |\n|---|---:|---:|---:|"
    )
    for name, (grouped, loop, naive) in kernel_rows(shape, token_counts, warmup, iters).items():
        print(f"| {name} | {grouped:.3f} | {loop:.3f} | {naive:.3f} |")


def main() -> None:
    parser = timing_parser(__doc__, warmup=8, iters=60, longer="a tenth")
    args = parser.parse_args()
    torch.set_num_threads(args.num_threads)
    with tempfile.TemporaryDirectory() as tmp:
        dense = make_tiny_checkpoint(Path(tmp) / "dense")  # the built-in architecture, intermediate 768
        moe = make_tiny_moe_checkpoint(Path(tmp) / "moe", overrides=MOE)
        dense_ms, moe_ms = step_rows(dense, args.warmup, args.iters), step_rows(moe, args.warmup, args.iters)
    print(f"one ModelRunner.execute, float32, {args.num_threads} thread(s), ms (median)\n")
    print("| step | dense (MLP 768) | MoE (32 x 192, top-4) | MoE / dense |\n|---|---:|---:|---:|")
    for name, ms in dense_ms.items():
        print(f"| {name} | {ms:.2f} | {moe_ms[name]:.2f} | {moe_ms[name] / ms:.2f}x |")
    print_kernel_table(TINY_LAYER, KERNEL_TOKENS, args.warmup, args.iters)
    print_kernel_table(A3B_LAYER, A3B_TOKENS, args.warmup // 4, max(1, args.iters // 6))


if __name__ == "__main__":
    main()
