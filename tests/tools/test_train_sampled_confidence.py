"""tools/train_sampled_confidence.py fits a DSpark drafter's sampled confidence head: its labels are what
rejection sampling accepts (against a Monte Carlo of the rule itself and the target's own transformers
logits), its fit lowers the BCE it starts from, and the folder it writes serves the head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.models.dspark_heads import SAMPLED_CONFIDENCE_FILE
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint
from openinfer.tools import dflash_data, train_sampled_confidence
from openinfer.tools.dflash_forward import make_blocks
from openinfer.tools.dspark_forward import slot_outputs
from openinfer.tools.training import start_run

K = 6  # DeepSpec's layout: block_size = K, every slot drafts
T = 0.7


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny target over the built-in tokenizer and a tiny DSpark drafter of it."""
    root = tmp_path_factory.mktemp("sampled")
    target = make_tiny_checkpoint(
        root / "target", seed=2, overrides={**SMALL_TEXT_QWEN3, "num_hidden_layers": 3}
    )
    drafter = make_tiny_dspark_checkpoint(
        root / "draft", target, seed=3, num_layers=2, block_size=K, target_layer_ids=(0, 1), markov_rank=8
    )
    return target, drafter


def loaded(folder: Path) -> DFlashDraftModel:
    model = DFlashDraftModel(DFlashConfig.from_folder(folder)).eval()
    model.load_weights(folder)
    return model


@torch.no_grad()
def test_labels_are_what_rejection_sampling_accepts(folders: tuple[Path, Path]) -> None:
    """Slot 0's label (its Markov bias reads the anchor's token, teacher-forced or not) equals the acceptance
    rate of 20,000 drafts drawn from the drafter's softmax(logits / T) and kept with probability
    min(1, p(x) / q(x)), p the target's softmax at T from its own transformers logits at the anchor."""
    target_folder, folder = folders
    target, model = dflash_data.load_target(target_folder), loaded(folder)
    tokens = torch.randint(3, 512, (2, 64), generator=torch.Generator().manual_seed(0))
    features, final = dflash_data.context_features(target, tokens, [0, 1], with_final=True)
    data = dflash_data.Distillation(tokens, torch.tensor([8, 16]), features, final)
    anchors = torch.tensor([[20, 41], [30, 50]])
    got = train_sampled_confidence.block_examples(model, target, data, torch.arange(2), anchors, T)
    assert got.labels.shape == (4, K) and bool(((got.labels >= 0) & (got.labels <= 1)).all())
    mask = DFlashConfig.from_folder(folder).mask_token_id
    blocks = make_blocks(tokens, anchors, K, K, mask)
    drafting = slot_outputs(model, target, features, blocks, K, teacher_forced=False).logits
    target_logits = target(input_ids=tokens).logits  # (2, 64, vocab): transformers' own forward
    generator = torch.Generator().manual_seed(1)
    for b in range(2):
        for a in range(2):
            q = (drafting[b, a, 0] / T).softmax(-1)
            p = (target_logits[b, anchors[b, a]].float() / T).softmax(-1)
            drawn = torch.multinomial(q, 20_000, replacement=True, generator=generator)
            kept = torch.rand(20_000, generator=generator) < (p[drawn] / q[drawn]).clamp(max=1.0)
            assert abs(kept.float().mean().item() - got.labels[2 * b + a, 0].item()) < 0.015


def test_the_fitted_head_is_written_and_served(folders: tuple[Path, Path], tmp_path: Path) -> None:
    """A run on the tiny pair: the fit lowers the BCE its start (the greedy head) had on what it fitted; the
    folder then names the temperature, holds the head's file beside an unchanged model.safetensors, loads
    with both heads, and its card carries one section however often the tool runs."""
    target_folder, source = folders
    folder = Path(tmp_path / "draft")
    folder.mkdir()
    for file in source.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    (folder / "README.md").write_text("# a drafter\n")
    before = (folder / "model.safetensors").read_bytes()
    argv = [
        *("--target", str(target_folder), "--drafter", str(folder), "--data-dir", str(tmp_path / "data")),
        *("--temperature", str(T), "--num-sequences", "4", "--seq-len", "128", "--num-val-sequences", "4"),
        *("--val-seq-len", "128", "--anchors", "4", "--iterations", "30", "--threads", "1"),
    ]
    args = train_sampled_confidence.parse_args(argv)
    target, model = dflash_data.load_target(target_folder), loaded(folder)
    assert model.confidence_head is not None
    split = start_run(args)
    spec = dflash_data.DataSpec("train", 4, 128, 0, 4, T)
    data = dflash_data.distillation_data(
        target, target_folder, split.train, spec, tmp_path / "data", [0, 1], True
    )
    train = train_sampled_confidence.examples(model, target, data, args, 0)
    fitted = train_sampled_confidence.fit(model.confidence_head, train, 30)
    start_bce = train_sampled_confidence.calibration(model.confidence_head, train)[1]
    fitted_bce = train_sampled_confidence.calibration(fitted, train)[1]
    assert start_bce is not None and fitted_bce is not None and fitted_bce < start_bce

    for _ in range(2):
        train_sampled_confidence.main(argv)
    assert json.loads((folder / "config.json").read_text())["sampled_confidence_temperature"] == T
    assert (folder / SAMPLED_CONFIDENCE_FILE).is_file() and (
        folder / "model.safetensors"
    ).read_bytes() == before
    served = loaded(folder)
    assert served.sampled_confidence_head is not None and served.confidence_head is not None
    card = (folder / "README.md").read_text()
    assert card.startswith("# a drafter\n") and card.count(train_sampled_confidence.CARD_HEADING) == 1
