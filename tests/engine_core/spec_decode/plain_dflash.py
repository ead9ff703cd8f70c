"""A plain-torch DFlash block over the tiny 3-layer target the DFlash and DSpark tests share: the whole context
recomputed, no paging, one request; the drafter's paged batched drafts must equal it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from openinfer.engine_core.models.dflash_config import AnchorLayout
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3

# 3 target layers so that layers 0 and 1 can both feed the drafter (the last one may not); 4 query heads
# over 2 KV heads (GQA) come from TINY_QWEN3_CONFIG.
SMALL = {**SMALL_QWEN3, "num_hidden_layers": 3}
LAYER_IDS = (0, 1)
WIDTH = len(LAYER_IDS) * 64  # aux hidden width
BLOCK = 6  # draft block size


def rms(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: Tensor, positions: Tensor, theta: float = 10000.0) -> Tensor:
    """x (T, heads, dim) rotated at positions (T,), rotate-half layout."""
    dim = x.shape[-1]
    angles = positions.double()[:, None] / theta ** (torch.arange(0, dim, 2).double() / dim)  # (T, dim / 2)
    cos, sin = angles.cos().float().repeat(1, 2)[:, None], angles.sin().float().repeat(1, 2)[:, None]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def reference_drafts(
    w: dict[str, Tensor],
    embed: Tensor,
    head: Tensor,
    context: Tensor,
    token: int,
    anchor: AnchorLayout,
    k: int,
    block: int = BLOCK,
) -> list[int]:
    """z-lab's draft step for one request: context (p, WIDTH) aux hidden at positions 0..p-1, the current
    token at p, a non-causal block of `block` slots, greedy drafts from the layout's slots."""
    hidden = reference_block_hidden(w, embed, context, token, block)
    first = 1 if anchor is AnchorLayout.MASK_SLOTS else 0
    return (hidden[first : first + k] @ head.T).argmax(-1).tolist()


def reference_block_hidden(
    w: dict[str, Tensor], embed: Tensor, context: Tensor, token: int, block: int = BLOCK
) -> Tensor:
    """(block, 64) final hidden states (after the last norm) of a block of the current token and mask tokens
    over context (p, WIDTH), the 2-layer drafter of `w` in plain torch."""
    p, heads, kv_heads, dim = context.shape[0], 4, 2, 16
    features = rms(context @ w["fc.weight"].T, w["hidden_norm.weight"])  # (p, 64)
    x = embed[torch.tensor([token] + [SMALL["vocab_size"] - 1] * (block - 1))]  # (block, 64); mask = last id
    all_pos = torch.arange(p + block)
    for i in range(2):
        pre = f"layers.{i}."
        h = rms(x, w[pre + "input_layernorm.weight"])
        q = rms(
            (h @ w[pre + "self_attn.q_proj.weight"].T).view(block, heads, dim),
            w[pre + "self_attn.q_norm.weight"],
        )
        kv_in = torch.cat((features, h))  # context keys/values first, then the block's
        keys = (kv_in @ w[pre + "self_attn.k_proj.weight"].T).view(p + block, kv_heads, dim)
        keys = rope(rms(keys, w[pre + "self_attn.k_norm.weight"]), all_pos).repeat_interleave(2, dim=1)
        values = (kv_in @ w[pre + "self_attn.v_proj.weight"].T).view(p + block, kv_heads, dim)
        q = rope(q, all_pos[p:])
        scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(dim)  # no mask: non-causal, whole context
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values.repeat_interleave(2, dim=1))
        x = x + out.reshape(block, heads * dim) @ w[pre + "self_attn.o_proj.weight"].T
        h = rms(x, w[pre + "post_attention_layernorm.weight"])
        mlp = F.silu(h @ w[pre + "mlp.gate_proj.weight"].T) * (h @ w[pre + "mlp.up_proj.weight"].T)
        x = x + mlp @ w[pre + "mlp.down_proj.weight"].T
    return rms(x, w["norm.weight"])
