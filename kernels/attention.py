"""The torch attention backend (CUDA and the CPU, whose in-place path is cpu_attention.py) and the padded
reference every backend is tested against (`padded_attention`)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from openinfer.kernels.attention_backend import write_kv_cache
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.backend_name import BackendName
from openinfer.kernels.cpu_attention import in_place_attention, in_place_pays


def padded_attention(q: Tensor, kv_cache: Tensor, meta: AttentionMetadata, scale: float) -> Tensor:
    """The reference: one `scaled_dot_product_attention` over the batch padded to (B, max_query_len) queries
    and (B, max_seq_len) keys gathered through the block tables (the new keys already written).

    Per-step index tensors and the mask come from the metadata's cached properties, so each layer pays for
    one gather of its keys and values, and for no padding at all when the queries are uniform.
    """
    _, num_heads, head_dim = q.shape
    num_reqs, max_q, max_s = len(meta.query_lens), meta.max_query_len, meta.max_seq_len
    num_kv_heads = kv_cache.shape[3]

    # index_select of whole slot rows: several times faster on the CPU than advanced indexing.
    slots = kv_cache.view(2, -1, num_kv_heads * head_dim)  # (2, num_slots, kv_heads * head_dim)
    kv = slots.index_select(1, meta.padded_key_slots).view(2, num_reqs, max_s, num_kv_heads, head_dim)
    keys, values = kv.transpose(2, 3).unbind(0)  # (B, num_kv_heads, S, head_dim) each

    if meta.queries_are_padded:
        padded_q = q.new_zeros(num_reqs * max_q, num_heads, head_dim)
        padded_q.index_copy_(0, meta.padded_query_index, q)
    else:
        padded_q = q  # every request has max_q tokens: the packed layout is the padded one
    bias = meta.attn_bias
    out = F.scaled_dot_product_attention(
        padded_q.reshape(num_reqs, max_q, num_heads, head_dim).transpose(1, 2),  # (B, num_heads, Q, D)
        keys,
        values,
        attn_mask=None if bias is None else bias.to(q.dtype),  # (B, 1, Q, S)
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )  # (B, num_heads, Q, head_dim)
    out = out.transpose(1, 2).reshape(num_reqs * max_q, num_heads, head_dim)
    if meta.queries_are_padded:
        out = out.index_select(0, meta.padded_query_index)
    return out  # (num_tokens, num_heads, head_dim)


class TorchAttentionBackend:
    """Portable backend (CPU and CUDA), made for its device once (`kernel_backends.select_backend`). On the CPU
    (``reads_in_place``) each request reads its keys and values in place (`cpu_attention.in_place_attention`:
    no per-layer copy of the whole context) unless the step is small enough that one padded gather is cheaper
    (`in_place_pays`); on CUDA, the padded gather of `padded_attention`, the reference every backend is tested
    against.
    """

    name = BackendName.TORCH
    cuda_graphs = False  # per-step index tensors are built from host lists: not capturable

    def __init__(self, reads_in_place: bool) -> None:
        # the CPU's in-place path where it pays (it walks block runs the metadata finds on the host)
        self.reads_in_place = reads_in_place

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Tensor, meta: AttentionMetadata, scale: float
    ) -> Tensor:
        write_kv_cache(kv_cache, k, v, meta.slot_mapping)
        if self.reads_in_place and in_place_pays(kv_cache, meta):
            return in_place_attention(q, kv_cache, meta, scale)
        return padded_attention(q, kv_cache, meta, scale)
