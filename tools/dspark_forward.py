"""DeepSpec's training forward and losses for drafters in its layout (DSpark, and its DFlash with markov_rank 0).

Part of tools/train_dspark.py; imported as a sibling module. The backbone is tools/dflash_forward.py's
`draft_hidden` (many draft blocks of one sequence per pass); on top of it, as DeepSpec trains it:

- every slot k of a block at anchor p drafts position p + k + 1 (the anchor layout, K = block_size drafts);
- the Markov head's bias is teacher-forced: slot k reads the target's token at p + k (the anchor for slot 0);
- loss = ce_weight * CE(draft, the target's greedy token) + l1_weight * ||softmax(draft) - softmax(target)||_1
  + bce_weight * BCE(confidence logit, acceptance label), each slot weighted exp(-k / loss_decay);
- the acceptance label is DeepSpec's 1 - TV(draft, target) (`sampled`, the chance a sampled draft is accepted)
  or whether the draft's argmax is the target's greedy token (`greedy`, what temperature 0 accepts).

Drafting for measurement (`greedy_drafts`) is not teacher-forced: slot k's bias reads slot k - 1's own argmax, as
the engine's `DFlashDrafter` drafts.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.tools.dflash_data import Distillation
from openinfer.tools.dflash_forward import (
    Blocks,
    draft_hidden,
    make_blocks,
    sample_anchors,
    slot_weight_vector,
    training_batch,
)


class AcceptanceLabel(enum.StrEnum):
    """What the confidence head learns to predict."""

    SAMPLED = "sampled"  # DeepSpec's: 1 - TV(draft, target), a sampled draft's acceptance probability
    GREEDY = "greedy"  # the draft's argmax equals the target's greedy token (temperature 0)


@dataclass(frozen=True)
class SlotOutputs:
    """What a drafter in DeepSpec's layout gives for each draft slot of each block."""

    hidden: Tensor  # (B, A, K, hidden): the slots' final hidden states
    logits: Tensor  # (B, A, K, vocab) float32: LM head plus the Markov bias (teacher-forced or drafted)
    confidence_logits: Tensor | None  # (B, A, K) float32; None without a confidence head
    head_features: Tensor | None = None  # (B, A, K, in_features): what the confidence head read


def slot_hidden(
    model: DFlashDraftModel, target: Qwen3ForCausalLM, features: Tensor, blocks: Blocks, num_drafts: int
) -> Tensor:
    """(B, A, K, hidden): the draft slots' final hidden states (slot k drafts anchor + k + 1)."""
    b, a, block_size = blocks.token_ids.shape
    embeds = target.get_input_embeddings()(blocks.token_ids.flatten(1))  # (B, Q, hidden)
    hidden = draft_hidden(model, features, embeds, blocks.positions.flatten(1), blocks.key_mask)
    return hidden.view(b, a, block_size, -1)[:, :, :num_drafts]


def slot_outputs(
    model: DFlashDraftModel,
    target: Qwen3ForCausalLM,
    features: Tensor,
    blocks: Blocks,
    num_drafts: int,
    teacher_forced: bool,
) -> SlotOutputs:
    """The slots' logits and confidence logits. Slot k's predecessor is the target's token at anchor + k
    (`teacher_forced`, training) or slot k - 1's argmax (drafting); slot 0's is the anchor's token."""
    hidden = slot_hidden(model, target, features, blocks, num_drafts)
    b, a, k, width = hidden.shape
    flat = hidden.reshape(b * a, k, width)
    logits = F.linear(flat, target.get_output_embeddings().weight).float()  # (B * A, K, vocab)
    previous = blocks.token_ids[:, :, 0].flatten()  # (B * A,)
    teacher = blocks.labels.flatten(0, 1)  # (B * A, K)
    markov, confidence = model.markov_head, model.confidence_head
    state = None if markov is None else markov.initial_state(b * a, flat)
    biased, confidences, head_features = [], [], []
    for slot in range(k):
        slot_logits, embed = logits[:, slot], None
        if markov is not None:
            embed = markov.embed(previous)
            bias, state = markov.step(embed, flat[:, slot], state)
            slot_logits = slot_logits + bias.float()
        if confidence is not None:
            head_features.append(confidence.features(flat[:, slot], embed))
            confidences.append(confidence.proj(head_features[-1]).squeeze(-1).float())
        biased.append(slot_logits)
        previous = teacher[:, slot] if teacher_forced else slot_logits.argmax(-1)
    return SlotOutputs(
        hidden,
        torch.stack(biased, dim=1).view(b, a, k, -1),
        torch.stack(confidences, dim=1).view(b, a, k) if confidences else None,
        torch.stack(head_features, dim=1).view(b, a, k, -1) if head_features else None,
    )


def target_logits(target: Qwen3ForCausalLM, final: Tensor, anchors: Tensor, num_drafts: int) -> Tensor:
    """(B, A, K, vocab) float32: the target's logits for position anchor + k + 1, its LM head of its final
    hidden state at anchor + k. final (B, L, hidden), anchors (B, A)."""
    b, a = anchors.shape
    positions = (anchors[:, :, None] + torch.arange(num_drafts)).flatten(1)  # (B, A * K)
    rows = final.gather(1, positions[:, :, None].expand(-1, -1, final.shape[-1]))  # (B, A * K, hidden)
    return F.linear(rows, target.get_output_embeddings().weight).float().view(b, a, num_drafts, -1)


@dataclass(frozen=True)
class LossTerms:
    """The slot-weighted means of DeepSpec's loss terms (nats for CE; the rest in [0, 2] / [0, inf))."""

    ce: Tensor
    l1: Tensor
    bce: Tensor | None  # None without a confidence head

    def total(self, args: argparse.Namespace) -> Tensor:
        loss = args.ce_weight * self.ce + args.l1_weight * self.l1
        return loss if self.bce is None else loss + args.bce_weight * self.bce


def loss_terms(
    outputs: SlotOutputs, teacher: Tensor, labels: Tensor, weights: Tensor, acceptance: AcceptanceLabel
) -> LossTerms:
    """outputs of `slot_outputs(teacher_forced=True)`, the target's logits (B, A, K, vocab), its greedy
    tokens (B, A, K) and the slot weights (K,) summing to 1."""
    k = labels.shape[-1]
    ce = F.cross_entropy(outputs.logits.flatten(0, 2), labels.flatten(), reduction="none").view(-1, k)
    l1 = (outputs.logits.softmax(-1) - teacher.softmax(-1)).abs().sum(-1).view(-1, k)  # (B * A, K)

    def weighted(per_slot: Tensor) -> Tensor:  # (B * A, K) -> mean over blocks of the weighted sum
        return (per_slot * weights).sum(-1).mean()

    bce = None
    if outputs.confidence_logits is not None:
        if acceptance is AcceptanceLabel.SAMPLED:
            label = (1.0 - 0.5 * l1.detach()).clamp(0.0, 1.0)
        else:
            label = (outputs.logits.argmax(-1) == labels).float().view(-1, k)
        bce = weighted(
            F.binary_cross_entropy_with_logits(
                outputs.confidence_logits.reshape(-1, k), label, reduction="none"
            )
        )
    return LossTerms(weighted(ce), weighted(l1), bce)


def deepspec_loss(
    model: DFlashDraftModel, target: Qwen3ForCausalLM, train: Distillation, args: argparse.Namespace
) -> Callable[[int], Tensor]:
    """Step s's loss: args.batch_size sequences x args.anchors blocks at generated positions drawn by a
    generator seeded with (seed, s), K = block_size drafts each."""
    assert train.final is not None, "DeepSpec's loss needs the target's final hidden states"
    k = args.block_size
    weights = slot_weight_vector(k, args.loss_decay)

    def step_loss(step: int) -> Tensor:
        rows, anchors, blocks = training_batch(train, args, k, step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_autocast):
            outputs = slot_outputs(model, target, train.features[rows], blocks, k, teacher_forced=True)
        assert train.final is not None
        teacher = target_logits(target, train.final[rows], anchors, k)
        return loss_terms(outputs, teacher, blocks.labels, weights, args.acceptance).total(args)

    return step_loss


@torch.no_grad()
def held_out_terms(
    model: DFlashDraftModel, target: Qwen3ForCausalLM, data: Distillation, args: argparse.Namespace
) -> LossTerms:
    """The loss terms in float32 at 16 fixed anchors of up to 64 of `data`'s sequences."""
    assert data.final is not None
    k = args.block_size
    weights = slot_weight_vector(k, args.loss_decay)
    model.eval()
    generator = torch.Generator().manual_seed(12345)
    terms = []
    for chunk in torch.arange(min(64, len(data.tokens))).split(8):
        anchors = sample_anchors(data.prompt_lens[chunk], 16, k, data.seq_len, generator)
        blocks = make_blocks(data.tokens[chunk], anchors, args.block_size, k, args.mask_token_id)
        outputs = slot_outputs(model, target, data.features[chunk], blocks, k, teacher_forced=True)
        teacher = target_logits(target, data.final[chunk], anchors, k)
        terms.append(loss_terms(outputs, teacher, blocks.labels, weights, args.acceptance))
    model.train()
    bces = [t.bce for t in terms if t.bce is not None]
    return LossTerms(
        torch.stack([t.ce for t in terms]).mean(),
        torch.stack([t.l1 for t in terms]).mean(),
        torch.stack(bces).mean() if bces else None,
    )
