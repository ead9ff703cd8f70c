"""Tensor parallelism without processes: the sharding arithmetic and its refusals, a rank's shard loaded from
only its slices of the checkpoint, and the runner's per-rank KV cache, its sizing and refusals (no collective
runs: a rank is built and loaded, never stepped)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from openinfer.engine_core.config import EngineConfig
from openinfer.engine_core.core.kv_sizing import kv_block_bytes
from openinfer.engine_core.models import weights
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.tensor_parallel import Shard, TensorParallel
from openinfer.engine_core.testing.checkpoint_reads import ReadCounter
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner

CPU = torch.device("cpu")
KV1 = {**SMALL_QWEN3, "num_key_value_heads": 1}  # 4 query heads over 1 KV head: replicated at N = 2


def test_even_split_gives_each_rank_its_slice() -> None:
    """16 heads over 2 ranks: rank 1 holds heads 8..15; counted in columns of 128, rows 1024..2047."""
    shard = TensorParallel(1, 2).shard_range(16, "attention heads")
    assert shard == Shard(8, 8, 16)
    assert shard.scaled(128) == Shard(1024, 1024, 2048)
    assert TensorParallel.SINGLE.shard_range(16, "attention heads").whole


def test_a_size_that_does_not_divide_is_refused_naming_the_numbers() -> None:
    """3 ranks cannot split 16 heads evenly: refused with both numbers."""
    with pytest.raises(
        ValueError, match="--tensor-parallel-size 3 does not divide the model's 16 attention heads"
    ):
        TensorParallel(0, 3).shard(16, "attention heads")


@pytest.mark.parametrize(
    ("num_kv_heads", "world", "expected"),
    [
        (8, 2, [Shard(0, 4, 8), Shard(4, 4, 8)]),  # split like the query heads
        (1, 2, [Shard(0, 1, 1), Shard(0, 1, 1)]),  # one head, replicated on both ranks
        (2, 4, [Shard(0, 1, 2), Shard(0, 1, 2), Shard(1, 1, 2), Shard(1, 1, 2)]),  # rank r: head r // 2
    ],
)
def test_kv_heads_split_or_replicate(num_kv_heads: int, world: int, expected: list[Shard]) -> None:
    """KV heads split evenly, or each replicated on world / num_kv_heads consecutive ranks (vLLM's rule)."""
    assert [TensorParallel(r, world).kv_heads(num_kv_heads) for r in range(world)] == expected


def test_fewer_kv_heads_than_ranks_must_divide_the_ranks() -> None:
    """2 KV heads over 3 ranks can be neither split nor replicated evenly."""
    with pytest.raises(
        ValueError, match="--tensor-parallel-size 3 is not a multiple of the model's 2 KV heads"
    ):
        TensorParallel(0, 3).kv_heads(2)


def test_a_rank_outside_its_group_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 2 of 2 ranks"):
        TensorParallel(2, 2)


def test_one_rank_makes_no_collective_call() -> None:
    """At one rank the collectives return their input without touching torch.distributed (never initialised
    here, where any call would raise)."""
    x = torch.arange(6.0).reshape(2, 3)
    assert TensorParallel.SINGLE.all_reduce(x) is x
    assert TensorParallel.SINGLE.all_gather_last(x) is x


def test_a_runner_refuses_heads_its_ranks_do_not_divide(tmp_path: Path) -> None:
    """4 query heads over 8 ranks: refused when the rank's model is built, naming the heads."""
    folder = make_tiny_checkpoint(tmp_path, overrides=SMALL_QWEN3)
    with pytest.raises(
        ValueError, match="--tensor-parallel-size 8 does not divide the model's 4 attention heads"
    ):
        ModelRunner(folder, CPU, 8, 4, parallel=TensorParallel(0, 8))


@pytest.fixture(scope="module", params=["tied", "untied", "kv1"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    overrides = KV1 if request.param == "kv1" else SMALL_QWEN3
    folder = tmp_path_factory.mktemp(request.param)
    return make_tiny_checkpoint(
        folder, seed=3, tie_word_embeddings=request.param != "untied", overrides=overrides
    )


def test_a_rank_reads_only_its_slices(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank reads exactly as many values as its shard holds (its slices, not whole tensors; only the
    replicated norms and KV heads are read whole), and they are the full model's values at the rank's
    slices."""
    full = ModelRunner(checkpoint, CPU, 8, 4).model
    for rank in range(2):
        counter = ReadCounter()
        monkeypatch.setattr(weights, "safe_open", counter.open)
        shard = ModelRunner(checkpoint, CPU, 8, 4, parallel=TensorParallel(rank, 2)).model
        monkeypatch.undo()
        assert counter.values == sum(p.numel() for p in shard.parameters())
        # whole: the norms, and the one KV head both ranks hold when it is replicated
        replicated = ("k_proj.weight", "v_proj.weight") if shard.config.num_key_value_heads == 1 else ()
        assert all(name.endswith(("norm.weight", *replicated)) for name in counter.whole)
        for name, target in shard.checkpoint_tensors().items():
            expected = full.checkpoint_tensors()[name]
            assert isinstance(expected, torch.Tensor)
            if isinstance(target, weights.CheckpointSlice):
                target, expected = target.target, expected[target.index]
            assert torch.equal(target, expected), name


def test_a_rank_holds_the_kv_cache_of_its_kv_heads(
    checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rank 1 of 2 caches its KV heads only (1 of 2 heads; the one replicated head with 1), and logs its
    bytes once: 2 layers x (2, 9 blocks, 4 tokens, 1 head, 16 dims) float32 = 9216 bytes."""
    with caplog.at_level(logging.INFO, logger="openinfer.engine_core.worker.model_runner"):
        runner = ModelRunner(checkpoint, CPU, 8, 4, dtype=torch.float32, parallel=TensorParallel(1, 2))
    assert [tuple(cache.shape) for cache in runner.kv_caches] == [(2, 9, 4, 1, 16)] * 2
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("rank 1/2")] == [
        f"rank 1/2: weights {sum(p.nbytes for p in runner.model.parameters()) / 2**20:.1f} MiB, "
        f"KV cache {2 * 9 * 4 * 16 * 4 * 2 / 2**20:.1f} MiB"
    ]


def test_a_sharded_rank_still_refuses_a_checkpoint_too_small(tmp_path: Path) -> None:
    """config.json asks for twice the MLP width its weights hold: a rank's half would fit them, but the
    whole model's sizes are checked, before anything is allocated."""
    folder = make_tiny_checkpoint(tmp_path, overrides=SMALL_QWEN3)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 512}))
    with pytest.raises(ValueError, match="config.json does not describe these weights"):
        ModelRunner(folder, CPU, 8, 4, parallel=TensorParallel(0, 2))


def test_kv_blocks_are_sized_by_a_ranks_kv_heads(checkpoint: Path) -> None:
    """A rank's KV block holds its KV heads: 2 layers x 2 (keys, values) x 1 head x 16 dims x 16 tokens x 4
    bytes = 4096 at N = 2, whether the model's 2 KV heads are split or its one head is replicated."""
    config = EngineConfig(model_path=checkpoint, served_model_name="t", kv_cache_gb=0.01)
    model = ModelConfig.from_folder(checkpoint)
    ranks = EngineConfig(
        model_path=checkpoint, served_model_name="t", kv_cache_gb=0.01, tensor_parallel_size=2
    )
    assert kv_block_bytes(ranks, model, torch.float32) == 2 * 2 * 1 * 16 * 16 * 4
    assert kv_block_bytes(config, model, torch.float32) == 2 * 2 * model.num_key_value_heads * 16 * 16 * 4
