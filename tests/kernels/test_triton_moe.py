"""The Triton fused-MoE kernels against a naive per-token, per-expert float32 oracle: on CUDA when present,
otherwise on the CPU under TRITON_INTERPRET=1 (tests/conftest.py). The interpreter is numpy: cases stay tiny."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from openinfer.kernels.moe import grouped_experts
from openinfer.kernels.triton_moe import align_block_size, block_m, fused_experts_triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# Largest error as a fraction of the oracle's largest output. The kernels accumulate in float32; float32 is
# left with summation order only. 16-bit rounds silu(gate) * up to its dtype before the down GEMM and the
# output once more: about 2 ulps at the output's scale (bfloat16's ulp 2^-8, float16's 2^-11), plus margin.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# (num_tokens, top_k, num_experts, hidden, intermediate, experts any token may pick)
CASES = [
    (1, 1, 4, 32, 16, 4),  # one decode token, one expert
    (1, 4, 8, 64, 64, 8),  # one token over 4 experts; sizes multiples of the blocks
    (37, 2, 8, 40, 24, 5),  # sizes not multiples of the blocks; experts 5-7 picked by no token
    (24, 4, 16, 96, 80, 16),  # a few dozen tokens over 16 experts, 4 each
    (80, 2, 4, 48, 40, 3),  # 160 pairs >= 32 per expert: 64-row blocks; expert 3 picked by no token
]


def make_layer(case: tuple[int, int, int, int, int, int], dtype: torch.dtype, seed: int = 0) -> list[Tensor]:
    """Random hidden states and weights (scaled so outputs stay O(1)) and a top-k routing: each token's k
    distinct experts drawn from the first `pickable`, weights in [0, 1)."""
    num_tokens, top_k, num_experts, hidden_size, inter_size, pickable = case
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, hidden_size, generator=g)
    w13 = torch.randn(num_experts, 2 * inter_size, hidden_size, generator=g) / hidden_size**0.5
    w2 = torch.randn(num_experts, hidden_size, inter_size, generator=g) / inter_size**0.5
    ids = torch.stack([torch.randperm(pickable, generator=g)[:top_k] for _ in range(num_tokens)])  # (T, k)
    weights = torch.rand(num_tokens, top_k, generator=g)
    return [
        hidden.to(DEVICE, dtype),
        w13.to(DEVICE, dtype),
        w2.to(DEVICE, dtype),
        weights.to(DEVICE),
        ids.to(DEVICE),
    ]


def oracle(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor) -> Tensor:
    """Per token, per chosen expert, in float32 on the CPU: Σ_j w_j · W2_e (silu(G_e x) ⊙ U_e x)."""
    inter_size = w2.shape[2]
    out = torch.zeros(hidden.shape, dtype=torch.float32)
    for t in range(hidden.shape[0]):
        x = hidden[t].float().cpu()
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gate = w13[e, :inter_size].float().cpu() @ x
            up = w13[e, inter_size:].float().cpu() @ x
            down = w2[e].float().cpu() @ (torch.nn.functional.silu(gate) * up)
            out[t] += float(topk_weights[t, j]) * down
    return out


def check(case: tuple[int, int, int, int, int, int], dtype: torch.dtype) -> None:
    layer = make_layer(case, dtype)
    got = fused_experts_triton(*layer)
    expected = oracle(*layer)
    assert got.shape == expected.shape and got.dtype == dtype
    error = (got.float().cpu() - expected).abs().max().item()
    assert error <= TOLERANCE[dtype] * expected.abs().max().item(), error


@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}k{}E{}H{}I{}".format(*c[:5]))
def test_float32_equals_the_oracle(case: tuple[int, int, int, int, int, int]) -> None:
    """float32: every routing shape (one token, unpicked experts, ragged sizes, 64-row blocks) is the oracle's."""
    check(case, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", [CASES[2], CASES[4]], ids=["ragged", "rows64"])
def test_16bit_equals_the_oracle(case: tuple[int, int, int, int, int, int], dtype: torch.dtype) -> None:
    """float16 and bfloat16 are the float32 oracle's within two output ulps, at ragged sizes and 64-row blocks."""
    check(case, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_equals_the_torch_grouped_path(dtype: torch.dtype) -> None:
    """The kernels equal kernels/moe.py's grouped torch path (the CPU's) on a routing with unpicked experts."""
    layer = make_layer(CASES[2], dtype, seed=3)
    got, expected = fused_experts_triton(*layer).float(), grouped_experts(*layer).float()
    # each is within TOLERANCE of the float32 oracle (both round to dtype), so within twice it of the other
    error = (got - expected).abs().max().item()
    assert error <= 2 * TOLERANCE[dtype] * expected.abs().max().item(), error


def test_align_pads_each_expert_to_whole_blocks() -> None:
    """Pairs sorted by expert into 4-row blocks, each expert's run padded with T * k, an unpicked expert
    given no block, the worst-case tail left to padding blocks."""
    ids = torch.tensor([[2, 0], [2, 3]], device=DEVICE)  # pairs 0..3 = (t0: e2, e0), (t1: e2, e3)
    sorted_ids, block_experts, num_padded = align_block_size(ids, num_experts=4, block_size=4)
    # counts [1, 0, 2, 1] -> runs of 4, 0, 4, 4 rows; buffers sized 4 pairs + 4 experts * 3 = 16 rows
    assert sorted_ids.tolist() == [1, 4, 4, 4, 0, 2, 4, 4, 3, 4, 4, 4, 4, 4, 4, 4]
    assert block_experts.tolist() == [0, 2, 3, 3]  # the last block is past num_padded, clamped to E - 1
    assert num_padded.tolist() == [12]


def test_block_rows_follow_pairs_per_expert() -> None:
    """16-row blocks while experts average under 32 pairs (decode), 64 from there (prefill)."""
    assert [block_m(pairs, 128) for pairs in (8, 64 * 8, 4095, 4096, 2048 * 8)] == [16, 16, 16, 64, 64]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replay_equals_the_oracle() -> None:
    """On CUDA: captured in a CUDA graph (no host sync anywhere) and replayed on a new routing, the output is
    the oracle's for that routing."""
    first, second = make_layer(CASES[3], torch.bfloat16, seed=1), make_layer(CASES[3], torch.bfloat16, seed=2)
    fused_experts_triton(*first)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts_triton(*first)
    for static, new in zip(first, second, strict=True):
        static.copy_(new)
    graph.replay()
    expected = oracle(*second)
    error = (out.float().cpu() - expected).abs().max().item()
    assert error <= TOLERANCE[torch.bfloat16] * expected.abs().max().item(), error
