"""DFlash drafter: paged batched drafts equal a plain whole-context reference; bad checkpoints are refused."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig
from openinfer.engine_core.models.drafter_fit import check_fits_target
from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
from openinfer.engine_core.spec_decode.drafter import ContextRows, ContextUpdate, DraftQuery, context_rows
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from tests.engine_core.spec_decode.plain_dflash import BLOCK, LAYER_IDS, SMALL, WIDTH, reference_drafts

PAGE = 4  # KV-cache page size: small, so contexts span several pages
NUM_PAGES = 48


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("target"), seed=1, tie_word_embeddings=request.param, overrides=SMALL
    )


@pytest.fixture(scope="module")
def runner(target: Path) -> ModelRunner:
    return ModelRunner(target, torch.device("cpu"), NUM_PAGES, PAGE)


def draft_checkpoint(
    folder: Path, target: Path, anchor: AnchorLayout | None = AnchorLayout.MASK_SLOTS
) -> Path:
    return make_tiny_dflash_checkpoint(
        folder, target, seed=2, num_layers=2, block_size=BLOCK, target_layer_ids=LAYER_IDS, anchor=anchor
    )


@dataclass
class Req:
    """A simulated request: its random aux hidden states per position and the pages it holds."""

    hidden: Tensor  # (64, WIDTH): "the target's" aux hidden state at every position it will reach
    position: int  # verified tokens so far == the current token's position
    block_ids: list[int] = field(default_factory=list)


class ScatteredPages:
    """Hands out page ids from a shuffled pool, so tables are non-contiguous and out of order."""

    def __init__(self, seed: int) -> None:
        self.free = list(range(NUM_PAGES))
        random.Random(seed).shuffle(self.free)

    def cover(self, req: Req, num_positions: int) -> None:
        while len(req.block_ids) * PAGE < num_positions:
            req.block_ids.append(self.free.pop())


@pytest.mark.parametrize("anchor", list(AnchorLayout), ids=lambda a: a.value)
def test_matches_reference_over_steps(
    anchor: AnchorLayout, target: Path, runner: ModelRunner, tmp_path: Path
) -> None:
    """Three requests (contexts of 5, 1 and 11 positions, scattered pages over a cache full of noise) extended
    by different accepted counts over four steps: every batched proposal equals the whole-context reference
    run on that request's own block (K + 1 slots, or max_drafts + 2 where fewer drafts are asked for, as
    z-lab's dflash_generate cuts its last block; never more than BLOCK), batched with blocks of other lengths."""
    k = 4
    drafter = DFlashDrafter(draft_checkpoint(tmp_path, target, anchor), runner, num_spec_tokens=k)
    assert drafter.aux_layer_ids == LAYER_IDS and drafter.config.anchor is anchor
    for cache in drafter.context_caches:
        cache.normal_()  # stale entries (other requests, rejected positions) must never be read
    weights = load_file(tmp_path / "model.safetensors")
    embed = runner.model.model.embed_tokens.weight.detach()
    head = embed if runner.model.lm_head is None else runner.model.lm_head.weight.detach()

    gen = torch.Generator().manual_seed(0)
    reqs = [Req(torch.randn(64, WIDTH, generator=gen) * 2, position=0) for _ in range(3)]
    pages = ScatteredPages(seed=3)
    new_positions = [[5, 1, 11], [3, 0, 1], [1, 5, 2], [2, 1, 5]]  # per step; step 0 is the prompts, 0 = idle
    max_drafts = [[4, 4, 4], [1, 0, 4], [3, 4, 2], [4, 4, 4]]
    for step, (grow, wanted) in enumerate(zip(new_positions, max_drafts, strict=True)):
        updates = []
        for req, n in zip(reqs, grow, strict=True):
            if n:
                pages.cover(req, req.position + n)
                updates.append(
                    ContextUpdate(
                        list(req.block_ids), req.position, req.hidden[req.position : req.position + n]
                    )
                )
                req.position += n
        drafter.extend_context(context_rows(updates, drafter.page_size))
        tokens = [(7 * step + 31 * i) % 256 for i in range(3)]
        queries = [
            DraftQuery(tok, req.position, list(req.block_ids), m)
            for tok, req, m in zip(tokens, reqs, wanted, strict=True)
        ]
        got = drafter.propose(queries)
        for req, tok, m, drafts in zip(reqs, tokens, wanted, got, strict=True):
            block = min(k + 1, m + 2, BLOCK)
            full = reference_drafts(weights, embed, head, req.hidden[: req.position], tok, anchor, k, block)
            assert drafts == full[:m], f"step {step}, context {req.position}"
    assert len({tuple(d) for d in got}) > 1  # the requests really draft differently


def test_aux_hidden_from_the_target(target: Path, runner: ModelRunner, tmp_path: Path) -> None:
    """The hidden states the runner hands the drafter (``execute`` with the drafter's aux_layer_ids) are
    transformers' outputs of those layers (``hidden_states[layer + 1]``, z-lab's convention), and a proposal
    from them equals the reference fed with transformers' own."""
    drafter = DFlashDrafter(draft_checkpoint(tmp_path, target), runner, num_spec_tokens=5)
    prompt, block_ids = [9, 200, 31, 4, 77, 15, 3], [7, 2]
    aux = runner.execute(chunk_step([SeqChunk(prompt, 0, block_ids)], runner), drafter.aux_layer_ids).aux
    assert aux is not None and aux.shape == (len(prompt), WIDTH)
    hf = Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.inference_mode():
        states = hf(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    expected = torch.cat([states[layer + 1][0] for layer in LAYER_IDS], dim=-1)  # (7, WIDTH)
    torch.testing.assert_close(aux, expected, atol=1e-4, rtol=1e-4)
    drafter.extend_context(context_rows([ContextUpdate(block_ids, 0, aux)], drafter.page_size))
    got = drafter.propose([DraftQuery(42, len(prompt), block_ids, 5)])
    embed = runner.model.model.embed_tokens.weight
    head = embed if runner.model.lm_head is None else runner.model.lm_head.weight
    weights = load_file(tmp_path / "model.safetensors")
    assert got == [reference_drafts(weights, embed, head, expected, 42, AnchorLayout.MASK_SLOTS, 5)]


def test_context_rows_outside_the_cache_are_refused(
    target: Path, runner: ModelRunner, tmp_path: Path
) -> None:
    """Rows whose slot is past the context cache, whose position is negative, or of another width are
    refused with what is wrong, and nothing is written."""
    drafter = DFlashDrafter(draft_checkpoint(tmp_path, target), runner, num_spec_tokens=5)
    before = drafter.context_caches.clone()
    slots = drafter.num_pages * drafter.page_size
    bad = [
        (
            ContextRows(torch.ones(1, WIDTH), np.array([0]), np.array([slots])),
            rf"slots must be in \[0, {slots}\)",
        ),
        (ContextRows(torch.ones(1, WIDTH), np.array([-1]), np.array([0])), r"at positions >= 0"),
        (ContextRows(torch.ones(1, WIDTH + 1), np.array([0]), np.array([0])), rf"must be \(n, {WIDTH}\)"),
        (ContextRows(torch.ones(2, WIDTH), np.array([0]), np.array([0])), r"2 context rows need 2 positions"),
    ]
    for rows, message in bad:
        with pytest.raises(ValueError, match=message):
            drafter.extend_context(rows)
    assert torch.equal(drafter.context_caches, before)


def test_refuses_missing_or_unexpected_tensor(target: Path, runner: ModelRunner, tmp_path: Path) -> None:
    """A checkpoint without fc.weight, or with an embedding of its own, is refused naming the tensor."""
    folder = draft_checkpoint(tmp_path, target)
    weights = load_file(folder / "model.safetensors")
    save_file({n: t for n, t in weights.items() if n != "fc.weight"}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"1 tensors missing from the checkpoint, e\.g\. \['fc\.weight'\]"):
        DFlashDrafter(folder, runner, num_spec_tokens=3)
    save_file({**weights, "embed_tokens.weight": torch.zeros(256, 64)}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="unexpected tensor 'embed_tokens.weight'"):
        DFlashDrafter(folder, runner, num_spec_tokens=3)


def test_refuses_k_past_the_block(target: Path, runner: ModelRunner, tmp_path: Path) -> None:
    """K = block_size is refused with the mask-slot layout (it drafts block_size - 1) and served with the
    anchor-slot layout; K past MAX_SPEC_TOKENS is refused whatever the block."""
    masks = draft_checkpoint(tmp_path / "masks", target, AnchorLayout.MASK_SLOTS)
    with pytest.raises(ValueError, match="num_spec_tokens 6 is more than one DFlash block yields.*at most 5"):
        DFlashDrafter(masks, runner, num_spec_tokens=BLOCK)
    anchor = draft_checkpoint(tmp_path / "anchor", target, AnchorLayout.ANCHOR_SLOT)
    assert DFlashDrafter(anchor, runner, num_spec_tokens=BLOCK).num_spec_tokens == BLOCK
    with pytest.raises(ValueError, match=r"must be in \[1, 32\], got 33"):
        DFlashDrafter(anchor, runner, num_spec_tokens=33)


def test_anchor_layout_is_read_from_config(target: Path, tmp_path: Path) -> None:
    """sample_from_anchor true/false sets the layout; without it, z-lab's architecture means mask slots; an
    unknown architecture needs an explicit layout; an explicit layout contradicting the config is refused."""
    anchor = draft_checkpoint(tmp_path / "a", target, AnchorLayout.ANCHOR_SLOT)
    assert DFlashConfig.from_folder(anchor).anchor is AnchorLayout.ANCHOR_SLOT
    masks = draft_checkpoint(tmp_path / "m", target, AnchorLayout.MASK_SLOTS)
    assert DFlashConfig.from_folder(masks).anchor is AnchorLayout.MASK_SLOTS
    silent = draft_checkpoint(tmp_path / "s", target, anchor=None)
    assert "sample_from_anchor" not in (silent / "config.json").read_text()
    assert DFlashConfig.from_folder(silent).anchor is AnchorLayout.MASK_SLOTS  # z-lab's DFlashDraftModel

    config = json.loads((silent / "config.json").read_text())
    config["architectures"] = ["SomeoneElsesDraftModel"]
    (silent / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="choose the anchor layout explicitly"):
        DFlashConfig.from_folder(silent)
    assert DFlashConfig.from_folder(silent, AnchorLayout.ANCHOR_SLOT).anchor is AnchorLayout.ANCHOR_SLOT
    with pytest.raises(ValueError, match="sample_from_anchor=True means anchor_slot, but mask_slots"):
        DFlashConfig.from_folder(anchor, AnchorLayout.MASK_SLOTS)


def test_refuses_a_target_it_does_not_fit(target: Path, runner: ModelRunner, tmp_path: Path) -> None:
    """A drafter reading a layer the target lacks, or made for a target of another depth, is refused naming
    the field; the target's last layer (transformers' post-norm hidden state) is served."""
    assert DFlashDrafter(
        make_tiny_dflash_checkpoint(tmp_path / "last", target, target_layer_ids=(0, 2)), runner, 3
    ).aux_layer_ids == (0, 2)
    folder = make_tiny_dflash_checkpoint(tmp_path, target, target_layer_ids=(0, 2))
    config = json.loads((folder / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [0, 3]
    del config["num_target_layers"]  # (else the config alone is refused, see below)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"target_layer_ids \(0, 3\) name a layer the target lacks: it has 3"
    ):
        DFlashDrafter(folder, runner, num_spec_tokens=3)
    config["dflash_config"]["target_layer_ids"] = [0]
    config["num_target_layers"] = 36
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="trained on a 36-layer target, this one has 3"):
        check_fits_target(DFlashConfig.from_folder(folder), runner.model_config)


def test_tiny_checkpoint_is_deterministic(target: Path, tmp_path: Path) -> None:
    """The same seed gives identical bytes, another seed other weights, torch's global RNG is untouched, and
    the config reads back as asked (z-lab's default layer choice: the middle of 3 layers)."""
    before = torch.random.get_rng_state()
    a = make_tiny_dflash_checkpoint(tmp_path / "a", target, seed=5)
    b = make_tiny_dflash_checkpoint(tmp_path / "b", target, seed=5)
    c = make_tiny_dflash_checkpoint(tmp_path / "c", target, seed=6)
    assert torch.equal(before, torch.random.get_rng_state())
    for name in ("config.json", "model.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    config = DFlashConfig.from_folder(a)
    assert (config.block_size, config.target_layer_ids, config.mask_token_id) == (8, (1,), 255)
    weights = load_file(a / "model.safetensors")
    assert weights["fc.weight"].shape == (64, 64) and torch.equal(weights["norm.weight"], torch.ones(64))
    assert not any(name.startswith(("embed_tokens", "lm_head")) for name in weights)


def test_refuses_fields_that_do_not_fit(target: Path, runner: ModelRunner, tmp_path: Path) -> None:
    """An fc whose width disagrees with target_layer_ids, or layer ids past num_target_layers, is refused at
    load with a message naming the config field."""
    folder = make_tiny_dflash_checkpoint(tmp_path, target, target_layer_ids=(0, 1))
    config = json.loads((folder / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [0, 1, 2]  # fc was written for two layers
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"fc.weight has shape \(64, 128\).*target_layer_ids \[0, 1, 2\]"):
        DFlashDrafter(folder, runner, num_spec_tokens=3)
    config["dflash_config"]["target_layer_ids"] = [0, 3]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"target_layer_ids \(0, 3\) name a layer past num_target_layers \(3\)"
    ):
        DFlashConfig.from_folder(folder)


def test_zlab_optional_keys(target: Path, tmp_path: Path) -> None:
    """z-lab's optional keys are read where z-lab reads them (dflash_config first, then the top level):
    scales, soft-cap (0 or absent: none), block_size 16 when absent, default layers from num_target_layers."""
    folder = make_tiny_dflash_checkpoint(tmp_path, target)
    config = json.loads((folder / "config.json").read_text())
    del config["block_size"], config["dflash_config"]["target_layer_ids"]
    config["dflash_config"].update(output_multiplier=2.0, final_logit_softcapping=0)
    config["input_embedding_scale"] = 0.25
    parsed = DFlashConfig.from_dict(config)
    assert (parsed.block_size, parsed.target_layer_ids) == (16, (1,))  # one draft layer: the middle of 3
    assert (parsed.input_embedding_scale, parsed.output_multiplier, parsed.final_logit_softcapping) == (
        0.25,
        2.0,
        None,
    )
    config["final_logit_softcapping"], config["dflash_config"]["final_logit_softcapping"] = 30.0, 12.5
    assert DFlashConfig.from_dict(config).final_logit_softcapping == 12.5
