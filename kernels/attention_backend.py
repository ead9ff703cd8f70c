"""What every paged-attention backend is (`AttentionBackend`: torch, Triton, flash-attn) and the one step they
all take first, `write_kv_cache`; kernel_backends.py chooses among them."""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.backend_name import BackendName


class AttentionBackend(Protocol):
    """Paged causal attention for one layer.

    `forward` first writes k/v into `kv_cache` at `meta.slot_mapping`, then attends each query to its own
    request's context read back from the cache, causally: the query at position p sees positions 0..p.
    Shapes: q (num_tokens, num_heads, head_dim), k/v (num_tokens, num_kv_heads, head_dim); returns
    (num_tokens, num_heads, head_dim) in q's dtype.
    """

    name: BackendName  # its --attention-backend name
    cuda_graphs: bool  # whether a forward may be captured in a CUDA graph and replayed with new inputs

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Tensor, meta: AttentionMetadata, scale: float
    ) -> Tensor: ...


def write_kv_cache(kv_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
    """Store the new tokens' keys and values at their slots."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    slots = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    slots[0].index_copy_(0, slot_mapping, k)
    slots[1].index_copy_(0, slot_mapping, v)
