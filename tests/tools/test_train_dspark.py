"""tools/train_dspark.py trains drafters in DeepSpec's layout: its drafting forward proposes what the engine
proposes from the written checkpoint (every Markov head type, and DeepSpec's DFlash), teacher forcing reads the
target's tokens, and its loss terms are PyPI speculators' reference losses on the same logits."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.models.dspark_heads import MarkovHeadType
from openinfer.engine_core.testing.deepspec_reference import speculators_eager_losses
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint
from openinfer.tools import dflash_card, dflash_data
from openinfer.tools.dflash_forward import Blocks, make_blocks
from openinfer.tools.dspark_forward import AcceptanceLabel, SlotOutputs, loss_terms, slot_outputs

SMALL = {**SMALL_TEXT_QWEN3, "num_hidden_layers": 3}
K = 6  # DeepSpec's layout: block_size = K, every slot drafts


def drafter(
    tmp_path: Path, markov_rank: int, head_type: MarkovHeadType
) -> tuple[Path, Path, DFlashDraftModel]:
    target_folder = make_tiny_checkpoint(tmp_path / "target", seed=2, overrides=SMALL)
    folder = make_tiny_dspark_checkpoint(
        tmp_path / "draft",
        target_folder,
        seed=3,
        num_layers=2,
        block_size=K,
        target_layer_ids=(0, 1),
        markov_rank=markov_rank,
        markov_head_type=head_type,
        confidence_head=markov_rank > 0,
    )
    model = DFlashDraftModel(DFlashConfig.from_folder(folder)).eval()
    model.load_weights(folder)
    return target_folder, folder, model


def random_data(target: torch.nn.Module, seq_len: int = 96) -> dflash_data.Distillation:
    tokens = torch.randint(3, 512, (3, seq_len), generator=torch.Generator().manual_seed(0))
    features, final = dflash_data.context_features(target, tokens, [0, 1], with_final=True)
    return dflash_data.Distillation(tokens, torch.tensor([8, 16, 24]), features, final)


@pytest.mark.parametrize(
    ("markov_rank", "head_type"),
    [
        (8, MarkovHeadType.VANILLA),
        (8, MarkovHeadType.GATED),
        (8, MarkovHeadType.RNN),
        (0, MarkovHeadType.VANILLA),
    ],
    ids=["vanilla", "gated", "rnn", "dflash"],
)
def test_drafting_forward_is_the_engines(tmp_path: Path, markov_rank: int, head_type: MarkovHeadType) -> None:
    """check_against_engine finds the engine's proposals equal to the argmax of the drafting forward (the
    Markov bias from the slot's own previous draft) at an anchor of each sequence (it raises otherwise)."""
    target_folder, folder, model = drafter(tmp_path, markov_rank, head_type)
    target = dflash_data.load_target(target_folder)
    data = random_data(target)
    args = argparse.Namespace(block_size=K, mask_token_id=DFlashConfig.from_folder(folder).mask_token_id)

    def block_logits(i: int, blocks: Blocks) -> torch.Tensor:
        return slot_outputs(model, target, data.features[i : i + 1], blocks, K, teacher_forced=False).logits

    assert dflash_card.check_against_engine(folder, target_folder, model, data, args, K, block_logits) == 3


@pytest.mark.parametrize("head_type", list(MarkovHeadType), ids=lambda t: t.value)
@torch.no_grad()
def test_teacher_forcing_reads_the_targets_tokens(tmp_path: Path, head_type: MarkovHeadType) -> None:
    """With the labels set to the blocks' own drafts, the teacher-forced forward is the drafting forward;
    with the target's tokens instead, the slots after the first change (the Markov head reads them)."""
    target_folder, folder, model = drafter(tmp_path, 8, head_type)
    target = dflash_data.load_target(target_folder)
    data = random_data(target)
    mask = DFlashConfig.from_folder(folder).mask_token_id
    blocks = make_blocks(data.tokens, torch.tensor([[10, 30], [20, 40], [30, 60]]), K, K, mask)
    drafting = slot_outputs(model, target, data.features, blocks, K, teacher_forced=False)
    own = dataclasses.replace(blocks, labels=drafting.logits.argmax(-1))
    forced_own = slot_outputs(model, target, data.features, own, K, teacher_forced=True)
    torch.testing.assert_close(forced_own.logits, drafting.logits)
    assert drafting.confidence_logits is not None and forced_own.confidence_logits is not None
    torch.testing.assert_close(forced_own.confidence_logits, drafting.confidence_logits)
    forced = slot_outputs(model, target, data.features, blocks, K, teacher_forced=True)
    torch.testing.assert_close(forced.logits[:, :, 0], drafting.logits[:, :, 0])  # slot 0 reads the anchor
    assert not torch.allclose(forced.logits[:, :, 1:], drafting.logits[:, :, 1:])


def test_loss_terms_are_speculators_reference_losses() -> None:
    """CE, L1 = 2 TV and the BCE against DeepSpec's label 1 - TV equal PyPI speculators' eager ce_loss and
    tv_loss on the same logits, slot-weighted; the greedy label is the argmax match."""
    eager = speculators_eager_losses()
    if eager is None:
        pytest.skip("PyPI speculators is not installed: `pip install --no-deps speculators==0.9.0`")
    generator = torch.Generator().manual_seed(1)
    b, a, vocab = 2, 3, 40
    draft = torch.randn(b, a, K, vocab, generator=generator) * 3
    teacher = torch.randn(b, a, K, vocab, generator=generator) * 3
    labels = teacher.argmax(-1)  # the data is the target's greedy text
    confidence = torch.randn(b, a, K, generator=generator)
    weights = torch.softmax(torch.randn(K, generator=generator), dim=0)
    outputs = SlotOutputs(torch.zeros(b, a, K, 4), draft, confidence)

    def weighted(per_slot: torch.Tensor) -> torch.Tensor:
        return (per_slot.reshape(-1, K) * weights).sum(-1).mean()

    flat_draft, flat_teacher = draft.reshape(1, -1, vocab), teacher.reshape(1, -1, vocab)
    tv = eager.tv_loss(flat_draft, flat_teacher).view(b, a, K)
    sampled = loss_terms(outputs, teacher, labels, weights, AcceptanceLabel.SAMPLED)
    torch.testing.assert_close(sampled.ce, weighted(eager.ce_loss(flat_draft, flat_teacher)))
    torch.testing.assert_close(sampled.l1, weighted(2 * tv))
    bce = F.binary_cross_entropy_with_logits(confidence, 1 - tv, reduction="none")
    assert sampled.bce is not None
    torch.testing.assert_close(sampled.bce, weighted(bce))
    labels[0, 0, :3] = draft[0, 0, :3].argmax(-1)  # some drafts right, for the greedy label
    greedy = loss_terms(outputs, teacher, labels, weights, AcceptanceLabel.GREEDY)
    hit = (draft.argmax(-1) == labels).float()
    assert 3 <= hit.sum() < hit.numel()
    assert greedy.bce is not None
    torch.testing.assert_close(
        greedy.bce, weighted(F.binary_cross_entropy_with_logits(confidence, hit, reduction="none"))
    )
