"""The drafter's training forward: many draft blocks per sequence at once, their slot-weighted loss, the initialisation.

Part of tools/train_dflash.py; imported as a sibling module, like training.py."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.models.dflash import DFlashDecoderLayer, DFlashDraftModel
from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig
from openinfer.engine_core.models.rotary import apply_rope
from openinfer.tools.dflash_data import Distillation


def draft_hidden(
    model: DFlashDraftModel, features: Tensor, block_embeds: Tensor, block_positions: Tensor, key_mask: Tensor
) -> Tensor:
    """`DFlashDraftModel.forward` over many blocks of one sequence per row, context computed in place.

    features (B, L, width): target features at positions 0..L-1; block_embeds (B, Q, hidden): every block's
    token embeddings, Q = blocks * block_size; block_positions (B, Q); key_mask (B, Q, L + Q) bool: a query
    sees context position j < its block's anchor and the keys of its own block. -> (B, Q, hidden) after the
    final norm, as `DFlashDraftModel.forward` returns it."""
    b, length, _ = features.shape
    q_len = block_embeds.shape[1]
    f = model.hidden_norm(model.fc(features)).flatten(0, 1)  # (B * L, hidden)
    context_positions = torch.arange(length).repeat(b)  # (B * L,)
    cos_c, sin_c = model.rotary.cos_sin(context_positions, f.dtype)  # (B * L, head_dim)
    cos_b, sin_b = model.rotary.cos_sin(block_positions.flatten(), block_embeds.dtype)  # (B * Q, head_dim)
    x = block_embeds
    for layer in cast("Iterable[DFlashDecoderLayer]", model.layers):  # ModuleList iterates as plain Modules
        attn = layer.self_attn
        heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        context_k, context_v = attn.context_kv(f, cos_c, sin_c)  # (B * L, kv_heads, dim) each
        h = layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(b * q_len, heads, dim))
        k = attn.k_norm(attn.k_proj(h).view(b * q_len, kv_heads, dim))
        q = apply_rope(q, cos_b, sin_b).view(b, q_len, heads, dim)
        k = apply_rope(k, cos_b, sin_b).view(b, q_len, kv_heads, dim)
        v = attn.v_proj(h).view(b, q_len, kv_heads, dim)
        keys = torch.cat((context_k.view(b, length, kv_heads, dim), k.to(context_k.dtype)), dim=1)
        values = torch.cat((context_v.view(b, length, kv_heads, dim), v.to(context_v.dtype)), dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # (B, heads, Q, dim)
            keys.transpose(1, 2).to(q.dtype),  # (B, kv_heads, L + Q, dim)
            values.transpose(1, 2).to(q.dtype),
            attn_mask=key_mask[:, None],  # (B, 1, Q, L + Q)
            scale=attn.scale,
            enable_gqa=heads != kv_heads,
        )  # (B, heads, Q, dim)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, q_len, heads * dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)


@dataclass(frozen=True)
class Blocks:
    """Draft blocks at chosen anchors of B sequences, laid out for `draft_hidden`."""

    token_ids: Tensor  # (B, A, block_size): the anchor's token, then mask tokens
    positions: Tensor  # (B, A, block_size): anchor + 0 .. block_size - 1
    key_mask: Tensor  # (B, A * block_size, L + A * block_size) bool
    labels: Tensor  # (B, A, K): the target's greedy tokens at anchor + 1 .. anchor + K


def make_blocks(tokens: Tensor, anchors: Tensor, block_size: int, num_drafts: int, mask_id: int) -> Blocks:
    """tokens (B, L), anchors (B, A) with anchor + num_drafts < L."""
    b, a = anchors.shape
    length = tokens.shape[1]
    offsets = torch.arange(block_size)
    positions = anchors[:, :, None] + offsets  # (B, A, block)
    token_ids = torch.full((b, a, block_size), mask_id, dtype=torch.int64)
    token_ids[:, :, 0] = tokens.gather(1, anchors)
    label_positions = anchors[:, :, None] + 1 + torch.arange(num_drafts)  # (B, A, K)
    labels = tokens.gather(1, label_positions.flatten(1)).view(b, a, num_drafts)
    block_of_query = torch.arange(a).repeat_interleave(block_size)  # (Q,)
    anchor_of_query = anchors.repeat_interleave(block_size, dim=1)  # (B, Q)
    sees_context = torch.arange(length)[None, None, :] < anchor_of_query[:, :, None]  # (B, Q, L)
    sees_block = (block_of_query[:, None] == block_of_query[None, :]).expand(b, -1, -1)  # (B, Q, Q)
    return Blocks(token_ids, positions, torch.cat((sees_context, sees_block), dim=2), labels)


def draft_logits(
    model: DFlashDraftModel,
    target: Qwen3ForCausalLM,
    features: Tensor,
    blocks: Blocks,
    anchor: AnchorLayout,
    num_drafts: int,
) -> Tensor:
    """(B, A, K, vocab) float32: the draft slots' logits through the target's (frozen) LM head."""
    b, a, block_size = blocks.token_ids.shape
    embeds = target.get_input_embeddings()(blocks.token_ids.flatten(1))  # (B, Q, hidden)
    hidden = draft_hidden(model, features, embeds, blocks.positions.flatten(1), blocks.key_mask)
    first = anchor.first_draft_slot
    slots = hidden.view(b, a, block_size, -1)[:, :, first : first + num_drafts]  # (B, A, K, hidden)
    return F.linear(slots, target.get_output_embeddings().weight).float()


def sample_anchors(
    prompt_lens: Tensor, count: int, num_drafts: int, seq_len: int, generator: torch.Generator
) -> Tensor:
    """(B, count) anchor positions in [prompt_len, seq_len - 1 - num_drafts]: generated tokens only, so
    that every label is the target's greedy continuation of the block's own context."""
    low = prompt_lens[:, None].float()
    span = (seq_len - num_drafts) - low  # positions available per sequence
    return (low + torch.rand(len(prompt_lens), count, generator=generator) * span).long()


def new_drafter(config: dict, seed: int) -> DFlashDraftModel:
    """A drafter of `config` (config.json's dict) with Qwen3's initialisation, seeded."""
    torch.manual_seed(seed)
    model = DFlashDraftModel(DFlashConfig.from_dict(config))
    init_weights(model)
    return model


def init_weights(model: DFlashDraftModel) -> None:
    """Qwen3's initialisation: matrices N(0, 0.02), norms 1 (DFlashDraftModel's own init is nn.Linear's)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)


def slot_weight_vector(num_drafts: int, decay: float) -> Tensor:
    """(K,) loss weights of the draft slots, slot k's exp(-(k-1)/decay), summing to 1."""
    weights = torch.exp(-torch.arange(num_drafts, dtype=torch.float32) / decay)
    return weights / weights.sum()


def training_batch(
    train: Distillation, args: argparse.Namespace, k: int, step: int
) -> tuple[Tensor, Tensor, Blocks]:
    """Step s's batch: args.batch_size sequences of `train` x args.anchors draft blocks of K = `k` drafts at
    generated positions, drawn by a generator seeded with (seed, s). Returns (rows (B,), anchors (B, A),
    blocks)."""
    generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    rows = torch.randint(0, len(train.tokens), (args.batch_size,), generator=generator)
    anchors = sample_anchors(train.prompt_lens[rows], args.anchors, k, train.seq_len, generator)
    return rows, anchors, make_blocks(train.tokens[rows], anchors, args.block_size, k, args.mask_token_id)


def distillation_loss(
    model: DFlashDraftModel, target: Qwen3ForCausalLM, train: Distillation, args: argparse.Namespace
) -> Callable[[int], Tensor]:
    """Step s's loss: args.batch_size sequences x args.anchors draft blocks at positions drawn by a generator
    seeded with (seed, s), cross-entropy of the K = block_size - 1 draft slots against the target's greedy
    tokens, slot-weighted (both layouts are trained to draft block_size - 1 tokens)."""
    k = args.block_size - 1
    slot_weights = slot_weight_vector(k, args.loss_decay)

    def step_loss(step: int) -> Tensor:
        rows, _, blocks = training_batch(train, args, k, step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_autocast):
            logits = draft_logits(model, target, train.features[rows], blocks, args.anchor, k)
        losses = F.cross_entropy(logits.flatten(0, 2), blocks.labels.flatten(), reduction="none")
        return (losses.view(-1, k) * slot_weights).sum(-1).mean()  # (B * A, K) weighted over slots

    return step_loss


@torch.no_grad()
def slot_losses(
    model: DFlashDraftModel,
    target: Qwen3ForCausalLM,
    data: Distillation,
    args: argparse.Namespace,
    slot_weights: Tensor,
) -> float:
    """The training loss in float32 at 16 fixed anchors of up to 256 of `data`'s sequences."""
    k = args.block_size - 1
    model.eval()
    generator = torch.Generator().manual_seed(12345)
    rows = torch.arange(min(256, len(data.tokens)))
    total = 0.0
    for chunk in rows.split(16):
        anchors = sample_anchors(data.prompt_lens[chunk], 16, k, data.seq_len, generator)
        blocks = make_blocks(data.tokens[chunk], anchors, args.block_size, k, args.mask_token_id)
        logits = draft_logits(model, target, data.features[chunk], blocks, args.anchor, k)
        losses = F.cross_entropy(logits.flatten(0, 2), blocks.labels.flatten(), reduction="none")
        total += (losses.view(-1, k) * slot_weights).sum(-1).sum().item()
    model.train()
    return total / (len(rows) * 16)
