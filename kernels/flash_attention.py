"""The flash-attn backend (CUDA only, chosen with ``--attention-backend flash_attn``; flash-attn is an optional
extra and is imported lazily)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from openinfer.kernels.attention_backend import write_kv_cache
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.backend_name import BackendName

FLASH_ATTN_PAGE_MULTIPLE = 256  # flash-attn's paged KV wants page_block_size % 256 == 0 (its C++ checks it)


class FlashAttentionBackend:
    """Paged attention through `flash_attn_varlen_func(..., block_table=...)`: flash-attn reads each request's
    keys and values from the paged cache itself (no gather). `causal=True` aligns the query block to the end of
    its context (bottom-right), which is exactly "the query at position p sees 0..p" for queries that are the
    last tokens of the context.

    Raises ValueError when block_size is not a multiple of 256, ImportError when flash-attn is not installed.
    """

    name = BackendName.FLASH_ATTN
    cuda_graphs = False  # not captured: the step's max_seqlen_k is a host int

    def __init__(self, block_size: int) -> None:
        if block_size % FLASH_ATTN_PAGE_MULTIPLE:
            raise ValueError(
                f"--attention-backend flash_attn needs --block-size a multiple of {FLASH_ATTN_PAGE_MULTIPLE} "
                f"(flash-attn's paged KV cache), got {block_size}; use --attention-backend triton for any block "
                "size"
            )
        try:
            from flash_attn import flash_attn_varlen_func
        except ImportError as e:
            raise ImportError(
                "--attention-backend flash_attn needs flash-attn: pip install 'openinfer[gpu]'"
            ) from e
        self._varlen: Callable[..., Tensor] = flash_attn_varlen_func

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Tensor, meta: AttentionMetadata, scale: float
    ) -> Tensor:
        write_kv_cache(kv_cache, k, v, meta.slot_mapping)
        key_cache, value_cache = kv_cache.unbind(0)  # (num_blocks, block_size, num_kv_heads, head_dim) each
        return self._varlen(
            q,
            key_cache,
            value_cache,
            cu_seqlens_q=meta.query_start_loc,
            cu_seqlens_k=meta.cu_seqlens_k,  # per-request key counts; the keys themselves come via block_table
            max_seqlen_q=meta.max_query_len,
            max_seqlen_k=meta.max_seq_len,
            softmax_scale=scale,
            causal=True,
            block_table=meta.block_tables,  # (B, max_blocks) int32
        )  # (num_tokens, num_heads, head_dim)
