"""Every draft layer's context keys and values in one matmul (`ContextProjection`).

A DFlash/DSpark drafter writes, for every position the target runs, each draft layer's context key
RoPE(k_norm(k_proj(f))) and value v_proj(f) of the same features f = hidden_norm(fc(aux)). Done layer by
layer that is ~15 small torch calls per layer on every engine step, even when no draft is proposed (the
drafting policy's paused steps still keep the context). Here the layers' k_proj and v_proj are one matrix,
their k_norms one broadcast, their RoPE one call, their caches one write: the same numbers (each output
column is the same dot product) in a handful of calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from openinfer.engine_core.models.qwen3 import rms_normalize
from openinfer.engine_core.models.rotary import apply_rope
from openinfer.kernels.cpu_matmul import PackedWeight, pack_weight, weight_matmul


class ContextProjection:
    """The fused context projections of draft attention layers whose weights are loaded (not a module: its
    tensors are copies made for serving, never a checkpoint's parameters)."""

    def __init__(
        self,
        k_proj: Sequence[torch.nn.Linear],
        v_proj: Sequence[torch.nn.Linear],
        k_norm: Sequence[Tensor],
        eps: float,
        num_kv_heads: int,
        pack: bool,
    ) -> None:
        parts = [p for k, v in zip(k_proj, v_proj, strict=True) for p in (k, v)]
        with torch.no_grad():
            weight = torch.cat([p.weight for p in parts])  # (L * 2 * kv_width, hidden): layer, k|v, heads
            self.weight_t = weight.t()  # (hidden, L * 2 * kv_width)
            biases = [p.bias for p in parts]
            self.bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
            self.k_norm = torch.stack(list(k_norm))[:, None, :]  # (L, 1, head_dim)
        self.packed: PackedWeight | None = pack_weight(weight) if pack else None
        self.eps = eps
        self.num_layers = len(k_proj)
        self.num_kv_heads = num_kv_heads
        self.head_dim = self.k_norm.shape[-1]

    def __call__(self, features: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """features (n, hidden), cos/sin (n, head_dim) at the context positions -> (L, 2, n, kv_heads,
        head_dim): each layer's keys (normed and rotated) and values, as its cache stores them."""
        n = features.shape[0]
        shape = (n, self.num_layers, 2, self.num_kv_heads, self.head_dim)
        kv = weight_matmul(features, self.weight_t, self.packed, self.bias).view(shape)
        keys = kv[:, :, 0]  # (n, L, kv_heads, head_dim)
        keys = self.k_norm * rms_normalize(keys.float(), self.eps).to(keys.dtype)  # each layer's k_norm
        keys = apply_rope(keys.reshape(n, -1, self.head_dim), cos, sin).view(keys.shape)
        return torch.stack((keys, kv[:, :, 1]), dim=2).permute(1, 2, 0, 3, 4)  # (L, 2, n, kv_heads, head_dim)

    def write(self, features: Tensor, cos: Tensor, sin: Tensor, cache: Tensor, slot_mapping: Tensor) -> None:
        """Store every layer's context keys/values for `features` at `slot_mapping` (n,) of ``cache`` (L, 2,
        num_pages, page_size, kv_heads, head_dim), one write for all layers."""
        num_layers, two, num_pages, page_size, kv_heads, head_dim = cache.shape
        slots = cache.view(num_layers, two, num_pages * page_size, kv_heads, head_dim)
        slots.index_copy_(2, slot_mapping, self(features, cos, sin))
