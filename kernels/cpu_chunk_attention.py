"""A prefill chunk's attention on the CPU: Q query tokens at positions context_len.. over their request's
whole context, causal. Two ways, chosen once per process by timing both (`chunk_attention_by_onednn`):

- torch's CPU flash kernel (`scaled_dot_product_attention`), whose block matmuls are MKL's sgemm;
- blocks of BLOCK_QUERIES queries, each a pair of oneDNN matmuls per KV head over the keys up to its last
  query (the G query heads of a KV head are the rows of one matmul, nothing repeated; keys past a block are
  never read, so a chunk after a long context costs what its causal part costs, where the flash kernel
  with an offset mask computes every block).

Why both: MKL's sgemm runs at about half oneDNN's rate on AMD's AVX-512 cores (a 1,500 x 1,024 x 6,144
float32 GEMM on one Zen 4 core: 181 ms against 88), and the flash kernel inherits it; on Intel's cores MKL
is at full speed and the fused flash kernel may win. Measured in docs/benchmarks.md.
"""

from __future__ import annotations

import logging
import time
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor

from openinfer.kernels.cpu_matmul import cpu_packing_available

logger = logging.getLogger(__name__)

# Queries per block of the oneDNN path: 128-512 measured, 256 fastest on a 1,500-token prompt.
BLOCK_QUERIES = 256
# Smaller chunks take the flash kernel whatever the probe says: below 32 queries, or 16,384 (query, key)
# pairs, the per-head matmul calls cost more than they save (measured on Zen 4: 64 queries of a fresh prompt
# 0.43 ms flash against 0.62; 32 after 500 tokens 1.70 against 1.23).
MIN_QUERIES = 32
MIN_PAIRS = 1 << 14
# The probe's shape: 256 queries after 256 tokens of context, Qwen3-0.6B's 16 query and 8 KV heads of 128.
_PROBE = (256, 256, 16, 8, 128)
_PROBE_ROUNDS = 3


def chunk_attention(q: Tensor, keys: Tensor, values: Tensor, context_len: int, scale: float) -> Tensor:
    """Q query tokens at positions context_len.. : q (Q, num_heads, head_dim) over keys/values
    (context_len + Q, num_kv_heads, head_dim), causal within the chunk -> (Q, num_heads, head_dim)."""
    if takes_onednn(q.shape[0], keys.shape[0], q.dtype):
        return onednn_chunk_attention(q, keys, values, context_len, scale)
    return flash_chunk_attention(q, keys, values, context_len, scale)


def takes_onednn(num_queries: int, seq_len: int, dtype: torch.dtype) -> bool:
    """Whether `chunk_attention` runs a chunk of ``num_queries`` over ``seq_len`` keys by the oneDNN blocks."""
    large = num_queries >= MIN_QUERIES and num_queries * seq_len >= MIN_PAIRS
    return large and chunk_attention_by_onednn(dtype)


def flash_chunk_attention(q: Tensor, keys: Tensor, values: Tensor, context_len: int, scale: float) -> Tensor:
    """`chunk_attention` by torch's CPU flash kernel."""
    num_queries, num_heads, _ = q.shape
    seq_len = keys.shape[0]
    if context_len == 0:
        mask = None  # a fresh prompt: plain causal
    else:  # query i sits at position context_len + i and sees keys 0..context_len + i
        query_pos = torch.arange(context_len, seq_len)[:, None]  # (Q, 1)
        mask = torch.arange(seq_len)[None, :] <= query_pos  # (Q, S) bool
    # 4-D, batch 1: torch's CPU flash-attention kernel takes only 4-D inputs; 3-D ones fall back to the math
    # path, which materializes the (H, Q, S) scores (2x slower on a 512-token chunk over 1,500 keys).
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],  # (1, H, Q, D)
        keys.transpose(0, 1)[None],  # (1, Hkv, S, D) view
        values.transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=num_heads != keys.shape[1],
    )  # (1, H, Q, D)
    return out[0].transpose(0, 1)


def onednn_chunk_attention(q: Tensor, keys: Tensor, values: Tensor, context_len: int, scale: float) -> Tensor:
    """`chunk_attention` by oneDNN matmuls, BLOCK_QUERIES queries at a time (exact softmax per block: a
    block's scores over its keys fit in memory, (G * 256, S) float32 per KV head)."""
    num_queries, num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    # each KV head's keys and values contiguous (oneDNN reads a strided matrix far slower): (Hkv, S, D)
    keys_by_head = keys.transpose(0, 1).contiguous()
    values_by_head = values.transpose(0, 1).contiguous()
    scaled = (q * scale).view(num_queries, num_kv_heads, group, head_dim)
    out = torch.empty_like(q)  # (Q, H, D)
    for start in range(0, num_queries, BLOCK_QUERIES):
        n = min(BLOCK_QUERIES, num_queries - start)
        visible = context_len + start + n  # keys 0..visible-1: the block's last query sees them all
        # key j > context_len + start + i is hidden from the block's query i: the block's own diagonal
        hidden = torch.ones(n, n, dtype=torch.bool).triu_(1)  # (n, n) over keys visible-n..visible-1
        for h in range(num_kv_heads):
            # (n, G, D) -> (G * n, D): row g * n + i is query i of head h * G + g
            rows = scaled[start : start + n, h].transpose(0, 1).reshape(group * n, head_dim)
            scores = _matmul_t(rows, keys_by_head[h, :visible]).view(group, n, visible)  # float32 or q's
            scores[:, :, visible - n :].masked_fill_(hidden, float("-inf"))
            probs = scores.softmax(-1).view(group * n, visible)
            block = _matmul_t(probs, values_by_head[h, :visible].t())  # (G * n, D)
            out[start : start + n, h * group : (h + 1) * group] = block.view(group, n, head_dim).transpose(
                0, 1
            )
    return out


def _matmul_t(x: Tensor, weight: Tensor) -> Tensor:
    """x (m, k) @ weight.T, weight (n, k) -> (m, n), by oneDNN (weight contiguous or a transposed view)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [None], "")


@cache
def chunk_attention_by_onednn(dtype: torch.dtype) -> bool:
    """Whether the oneDNN blocks beat the flash kernel on this CPU in ``dtype`` (never where oneDNN has no
    matmul in it): timed once per process on _PROBE's shape, best of a few interleaved rounds, logged."""
    if not cpu_packing_available(dtype):
        return False
    num_queries, context_len, num_heads, num_kv_heads, head_dim = _PROBE
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(num_queries, num_heads, head_dim, generator=generator).to(dtype)
    keys, values = torch.randn(2, context_len + num_queries, num_kv_heads, head_dim, generator=generator).to(
        dtype
    )
    scale = head_dim**-0.5
    flash_s, onednn_s = float("inf"), float("inf")
    with torch.inference_mode():
        for _ in range(_PROBE_ROUNDS):
            started = time.perf_counter()
            flash_chunk_attention(q, keys, values, context_len, scale)
            flash_s = min(flash_s, time.perf_counter() - started)
            started = time.perf_counter()
            onednn_chunk_attention(q, keys, values, context_len, scale)
            onednn_s = min(onednn_s, time.perf_counter() - started)
    logger.info(
        "prefill attention (%d queries after %d tokens, %s): flash kernel %.1f ms, oneDNN blocks %.1f ms: "
        "prefill chunks use %s",
        num_queries,
        context_len,
        str(dtype).removeprefix("torch."),
        flash_s * 1e3,
        onednn_s * 1e3,
        "the oneDNN blocks" if onednn_s < flash_s else "the flash kernel",
    )
    return onednn_s < flash_s
