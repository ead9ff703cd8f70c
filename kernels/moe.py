"""The experts of a mixture-of-experts layer, computed as groups: `fused_experts` over routed tokens.

On CUDA it calls the Triton fused-MoE kernel (`triton_moe.py`); elsewhere, and as its reference, a torch path
whose cost follows the experts the batch routes to: the (token, expert) pairs are sorted by expert and each
expert that has tokens runs one matmul over all of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def fused_experts(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor) -> Tensor:
    """sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with e = topk_ids[t, j].

    hidden (T, H); w13 (E, 2 * I, H), gate rows then up rows; w2 (E, H, I); topk_weights (T, k) float32;
    topk_ids (T, k) int64. Returns (T, H) in hidden's dtype.
    """
    if hidden.is_cuda:
        from openinfer.kernels.triton_moe import fused_experts_triton  # Triton only where CUDA runs it

        return fused_experts_triton(hidden, w13, w2, topk_weights, topk_ids)
    return grouped_experts(hidden, w13, w2, topk_weights, topk_ids)


def grouped_experts(
    hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor
) -> Tensor:
    """`fused_experts` in torch: one gate/up and one down matmul per expert present in topk_ids, in
    ascending expert order (transformers' order, so float32 sums match it), accumulated in float32."""
    num_tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)  # (T * k,): pair p is token p // k's j-th choice, j = p % k
    order = flat_ids.argsort(stable=True)  # pairs grouped by expert
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()  # (E,) pairs per expert
    token_of_pair = order // top_k  # (T * k,) in expert order
    weight_of_pair = topk_weights.reshape(-1)[order]  # (T * k,) float32
    out = torch.zeros(num_tokens, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:  # an expert no token picked costs nothing but this test
            continue
        tokens = token_of_pair[start : start + count]  # (n,) token rows routed to this expert
        gate, up = F.linear(hidden[tokens], w13[expert]).chunk(2, dim=-1)  # (n, I) each
        down = F.linear(F.silu(gate) * up, w2[expert])  # (n, H)
        out.index_add_(0, tokens, down.float() * weight_of_pair[start : start + count, None])
        start += count
    return out.to(hidden.dtype)


def naive_experts(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor) -> Tensor:
    """`fused_experts` one token and one choice at a time: the plainest statement of the math (tests and
    benchmarks compare the grouped paths to it)."""
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for t in range(hidden.shape[0]):
        for j in range(topk_ids.shape[1]):
            expert = int(topk_ids[t, j])
            gate, up = (w13[expert] @ hidden[t]).chunk(2)  # (I,) each
            out[t] += topk_weights[t, j] * (w2[expert] @ (F.silu(gate) * up)).float()
    return out.to(hidden.dtype)
