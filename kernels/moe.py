"""The experts of a mixture-of-experts layer over routed tokens, in torch: for hidden (T, H), w13 (E, 2 * I, H)
(gate rows then up rows), w2 (E, H, I), topk_weights (T, k) float32 and topk_ids (T, k) int64, each token's
sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with e = topk_ids[t, j], (T, H) in hidden's
dtype. A pair whose id is E (past the last expert: under expert parallelism, one that another rank holds)
adds nothing.

`grouped_experts` is the CPU's kernel and the reference of CUDA's (the Triton fused-MoE kernel of
`triton_moe.py`; kernel_backends.py chooses): its cost follows the experts the batch routes to, the (token,
expert) pairs sorted by expert and each expert that has tokens running one gate/up and one down matmul over all
of its tokens. `naive_experts` is the plainest statement of the sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def grouped_experts(
    hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor
) -> Tensor:
    """The experts' sum (module docstring) in torch: the (token, expert) pairs sorted by expert, one gate/up and
    one down matmul per expert present in topk_ids, then one weighting and one scatter-add for all pairs. The adds
    reach each token in ascending expert order (transformers' order, so float32 sums match it), in float32."""
    num_tokens, top_k = topk_ids.shape
    if num_tokens == 1:  # one decoding request: its k experts directly, no sort, gather or scatter
        return _one_token_experts(hidden, w13, w2, topk_weights, topk_ids)
    flat_ids = topk_ids.reshape(-1)  # (T * k,): pair p is token p // k's choice p % k
    num_experts = w13.shape[0]
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()  # (E,) or (E + 1,): pairs per expert
    # pairs grouped by expert, those of id E (no expert here) last and dropped: P of them are computed
    order = flat_ids.argsort(stable=True)[: sum(counts[:num_experts])]  # (P,)
    token_of_pair = order // top_k  # (P,) in expert order
    x = hidden.index_select(0, token_of_pair)  # (P, H) each pair's token row, in expert order
    down = torch.empty_like(x)  # (P, H) each pair's expert output
    width = w13.shape[1] // 2  # I
    start = 0
    for expert, count in enumerate(counts[:num_experts]):
        if count == 0:  # an expert no token picked costs nothing but this test
            continue
        end = start + count
        gate_up = F.linear(x[start:end], w13[expert])  # (n, 2 * I)
        act = F.silu(gate_up[:, :width]).mul_(gate_up[:, width:])  # (n, I)
        torch.mm(act, w2[expert].t(), out=down[start:end])  # (n, H)
        start = end
    weighted = down.float().mul_(topk_weights.reshape(-1)[order, None])  # (P, H) float32
    out = torch.zeros(num_tokens, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    return out.index_add_(0, token_of_pair, weighted).to(hidden.dtype)


def _one_token_experts(
    hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor
) -> Tensor:
    """`grouped_experts` of a single token: one gate/up and one down matmul per choice, added in ascending
    expert order in float32 (the grouped path's order and precision)."""
    width = w13.shape[1] // 2  # I
    out = torch.zeros(1, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    ids, choices = topk_ids[0].sort()
    for expert, choice in zip(ids.tolist(), choices.tolist(), strict=True):
        if expert == w13.shape[0]:  # no expert here (another rank's), nor after it: ids are sorted
            break
        gate_up = F.linear(hidden, w13[expert])  # (1, 2 * I)
        act = F.silu(gate_up[:, :width]).mul_(gate_up[:, width:])  # (1, I)
        out.add_(F.linear(act, w2[expert]).float().mul_(topk_weights[0, choice]))
    return out.to(hidden.dtype)


def naive_experts(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor) -> Tensor:
    """The experts' sum one token and one choice at a time: the plainest statement of the math (tests and
    benchmarks compare the grouped paths to it)."""
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for t in range(hidden.shape[0]):
        for j in range(topk_ids.shape[1]):
            expert = int(topk_ids[t, j])
            if expert == w13.shape[0]:  # another rank's expert
                continue
            gate, up = (w13[expert] @ hidden[t]).chunk(2)  # (I,) each
            out[t] += topk_weights[t, j] * (w2[expert] @ (F.silu(gate) * up)).float()
    return out.to(hidden.dtype)
