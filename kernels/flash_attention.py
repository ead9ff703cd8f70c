"""The flash-attn backend (CUDA only; flash-attn is an optional extra and is imported lazily)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from openinfer.kernels.attention import AttentionMetadata, write_kv_cache


class FlashAttentionBackend:
    """Paged attention through `flash_attn_varlen_func`: each request's context is gathered from the block
    table into one packed K/V; `causal=True` aligns the query block to the end of its context (bottom-right),
    which is exactly "the query at position p sees 0..p" for queries that are the last tokens of the context.

    Raises ImportError when flash-attn is not installed.
    """

    cuda_graphs = False  # per-step index tensors are built from host lists: not capturable

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func

        self._varlen: Callable[..., Tensor] = flash_attn_varlen_func

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Tensor, meta: AttentionMetadata, scale: float
    ) -> Tensor:
        write_kv_cache(kv_cache, k, v, meta.slot_mapping)
        _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
        slots = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
        keys = slots[0][meta.packed_key_slots]  # (sum of seq_lens, num_kv_heads, head_dim)
        values = slots[1][meta.packed_key_slots]
        return self._varlen(
            q,
            keys,
            values,
            cu_seqlens_q=meta.query_start_loc,
            cu_seqlens_k=meta.cu_seqlens_k,
            max_seqlen_q=meta.max_query_len,
            max_seqlen_k=meta.max_seq_len,
            softmax_scale=scale,
            causal=True,
        )  # (num_tokens, num_heads, head_dim)
