"""Qwen3.5 under tensor parallelism without processes: a rank's shard (Gated DeltaNet heads with their
conv channels, gated attention's query and gate rows) loaded from only its slices of a released-layout
checkpoint, its state slots sized by its heads, and the refusals (no collective runs: a rank is built and
loaded, never stepped)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openinfer.engine_core.models import weights
from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.models.qwen3_5 import Qwen3_5ForCausalLM
from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.testing.checkpoint_reads import ReadCounter
from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner

CPU = torch.device("cpu")
STATES = StateGeometry(2, 1)  # 3 slots, the scratch one included


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the released vision-language layout, its vision tower and MTP head skipped by every rank
    return make_tiny_qwen3_5_checkpoint(tmp_path_factory.mktemp("q35"), seed=5)


def shard(folder: Path, rank: int, world: int = 2) -> Qwen3_5ForCausalLM:
    model = ModelRunner(
        folder, CPU, 8, 4, torch.float32, state_geometry=STATES, parallel=TensorParallel(rank, world)
    ).model
    assert isinstance(model, Qwen3_5ForCausalLM)
    return model


def slices_of(target: weights.Target) -> list[tuple[torch.Tensor, tuple[slice, ...]]]:
    """(destination, index into the checkpoint tensor) of each piece of a target (the whole: no index)."""
    if isinstance(target, torch.Tensor):
        return [(target, ())]
    pieces = (target,) if isinstance(target, weights.CheckpointSlice) else target
    return [(piece.target, piece.index) for piece in pieces]


def test_a_rank_reads_only_its_slices(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank reads exactly as many values as its shard holds (the DeltaNet's in_proj_qkv and conv1d as
    three row slices each: its q, k and v heads; only norms and the one replicated KV head whole), and they
    are the full model's values at the rank's slices."""
    full = ModelRunner(checkpoint, CPU, 8, 4, torch.float32, state_geometry=STATES).model
    assert isinstance(full, Qwen3_5ForCausalLM)
    whole = full.checkpoint_tensors()
    for rank in range(2):
        counter = ReadCounter()
        monkeypatch.setattr(weights, "safe_open", counter.open)
        model = shard(checkpoint, rank)
        monkeypatch.undo()
        assert counter.values == sum(p.numel() for p in model.parameters())
        replicated = ("norm.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
        assert counter.whole and all(name.endswith(replicated) for name in counter.whole)
        targets = model.checkpoint_tensors()
        assert len(slices_of(targets["model.layers.0.linear_attn.in_proj_qkv.weight"])) == 3
        for name, target in targets.items():
            expected = whole[name]
            assert isinstance(expected, torch.Tensor)
            for destination, index in slices_of(target):
                assert torch.equal(destination, expected[index]), name


def test_a_rank_holds_the_states_of_its_heads(checkpoint: Path) -> None:
    """Rank 1 of 2 keeps 1 key head's q and k channels and 2 value heads' v channels (16 + 16 + 32 = 64 of
    128) in its conv state, its 2 value heads of 4 in its recurrent state: half of one rank's bytes."""
    model = shard(checkpoint, 1)
    for layer in model.linear_layers:
        assert layer.conv_state is not None and layer.recurrent_state is not None
        assert tuple(layer.conv_state.shape) == (3, 64, 3)  # (slots, channels, kernel - 1)
        assert tuple(layer.recurrent_state.shape) == (3, 2, 16, 16)  # (slots, value heads, key, value dims)
        assert (layer.k_heads.start, layer.v_heads.start) == (1, 2)
    # 3 DeltaNet layers x (64 x 3 conv + 2 x 16 x 16 recurrent) float32 values
    assert model.state_bytes == 3 * (64 * 3 + 2 * 16 * 16) * 4


def test_ranks_that_split_a_key_head_are_refused(tmp_path: Path) -> None:
    """1 key head over 2 ranks: a key head and its value heads cannot be split, refused naming both."""
    folder = make_tiny_qwen3_5_checkpoint(
        tmp_path, overrides={"linear_num_key_heads": 1, "linear_num_value_heads": 2}
    )
    with pytest.raises(
        ValueError,
        match=r"--tensor-parallel-size 2 does not divide the model's 1 Gated DeltaNet key heads "
        r"\(linear_num_key_heads; 2 value heads",
    ):
        shard(folder, 0)
