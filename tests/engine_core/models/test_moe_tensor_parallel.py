"""Qwen3-MoE over ranks without processes: which experts and widths a rank holds and its refusals, the
experts' sum split over ranks (by width, or by whole experts with the other ranks' pairs skipped) adding up to
the whole sum, and a rank's shard loaded from only its slices or its experts (no collective runs)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from openinfer.engine_core.models import weights
from openinfer.engine_core.models.qwen3_moe import local_routing
from openinfer.engine_core.models.tensor_parallel import Shard, TensorParallel
from openinfer.engine_core.testing.checkpoint_reads import ReadCounter
from openinfer.engine_core.testing.qwen3_moe_checkpoint import make_tiny_moe_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.kernels.kernel_backends import ExpertsBackend
from openinfer.kernels.moe import grouped_experts

CPU = torch.device("cpu")
E, H, WIDTH, K = 8, 16, 12, 2  # experts, hidden, expert width (I), top-k


def test_a_rank_holds_every_experts_slice_or_its_whole_experts() -> None:
    """Rank 1 of 2: without expert parallelism all 8 experts, columns 6..11 of 12; with it, experts 4..7
    whole."""
    tp, ep = TensorParallel(1, 2), TensorParallel(1, 2, expert_parallel=True)
    assert (tp.experts(E), tp.expert_width(WIDTH)) == (Shard(0, 8, 8), Shard(6, 6, 12))
    assert (ep.experts(E), ep.expert_width(WIDTH)) == (Shard(4, 4, 8), Shard(0, 12, 12))


def test_expert_parallel_refuses_ranks_that_do_not_divide_the_experts(tmp_path: Path) -> None:
    """6 experts over 4 ranks: refused when the rank's model is built, naming both numbers; without expert
    parallelism the same 4 ranks split each expert's width and load."""
    folder = make_tiny_moe_checkpoint(tmp_path, overrides={"num_experts": 6})
    with pytest.raises(ValueError, match="--tensor-parallel-size 4 does not divide the model's 6 experts"):
        ModelRunner(folder, CPU, 8, 4, parallel=TensorParallel(0, 4, expert_parallel=True))
    ModelRunner(folder, CPU, 8, 4, parallel=TensorParallel(0, 4))


def random_experts(num_tokens: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(num_tokens)
    hidden = torch.randn(num_tokens, H, generator=g)
    w13, w2 = torch.randn(E, 2 * WIDTH, H, generator=g) * 0.3, torch.randn(E, H, WIDTH, generator=g) * 0.3
    weights, ids = torch.rand(num_tokens, E, generator=g).topk(K, dim=-1)  # K distinct experts per token
    return hidden, w13, w2, weights, ids


@pytest.mark.parametrize("skips_absent", [True, False])
@pytest.mark.parametrize("num_tokens", [1, 9])
def test_each_ranks_experts_sum_to_the_whole(num_tokens: int, skips_absent: bool) -> None:
    """Over 2 ranks each holding 4 whole experts, the ranks' partial sums (other ranks' pairs skipped by the
    kernel, or given weight 0 on expert 0) add up to one rank's sum; so do the sums of each rank's half of
    every expert's width."""
    hidden, w13, w2, weights, ids = random_experts(num_tokens)
    whole = grouped_experts(hidden, w13, w2, weights, ids)
    kernel = ExpertsBackend("torch", grouped_experts, skips_absent)
    by_experts = torch.zeros_like(whole)
    for held in (Shard(0, 4, 8), Shard(4, 4, 8)):
        local_weights, local_ids = local_routing(weights, ids, held, kernel)
        by_experts += grouped_experts(hidden, w13[held.slice], w2[held.slice], local_weights, local_ids)
    torch.testing.assert_close(by_experts, whole, rtol=0, atol=1e-5)
    by_width = torch.zeros_like(whole)
    for cols in (slice(0, 6), slice(6, 12)):
        rows = torch.cat((w13[:, :WIDTH][:, cols], w13[:, WIDTH:][:, cols]), dim=1)  # (E, 2 * 6, H)
        by_width += grouped_experts(hidden, rows, w2[:, :, cols], weights, ids)
    torch.testing.assert_close(by_width, whole, rtol=0, atol=1e-5)


@pytest.fixture(scope="module", params=["per_expert", "stacked"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    # layer 0 dense (its MLP split like Qwen3's), layer 1 sparse
    overrides = {"mlp_only_layers": [0]}
    return make_tiny_moe_checkpoint(
        folder, seed=4, overrides=overrides, stacked_experts=request.param == "stacked"
    )


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_a_rank_reads_only_its_experts_or_their_slices(
    checkpoint: Path, expert_parallel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of 2 ranks reads exactly as many values as its shard holds: every expert's slice, or its 4 whole
    experts (the other 4 never read), in either checkpoint form; and they are the full model's values."""
    full = ModelRunner(checkpoint, CPU, 8, 4).model
    expected_targets = full.checkpoint_tensors(stacked_experts=True)
    for rank in range(2):
        parallel = TensorParallel(rank, 2, expert_parallel=expert_parallel)
        counter = ReadCounter()
        monkeypatch.setattr(weights, "safe_open", counter.open)
        shard = ModelRunner(checkpoint, CPU, 8, 4, parallel=parallel).model
        monkeypatch.undo()
        assert counter.values == sum(p.numel() for p in shard.parameters())
        layer = shard.model.layers[1].mlp
        expected_w13 = expected_targets["model.layers.1.mlp.experts.gate_up_proj"]
        assert isinstance(expected_w13, torch.Tensor)
        if expert_parallel:  # (4, 2 * 32, 64): experts 4r .. 4r + 3 whole
            assert torch.equal(layer.experts.gate_up_proj, expected_w13[4 * rank : 4 * rank + 4])
        else:  # (8, 2 * 16, 64): rank r's 16 gate rows, then its 16 up rows, of every expert
            gate, up = expected_w13[:, 16 * rank : 16 * rank + 16], expected_w13[:, 32 + 16 * rank :][:, :16]
            assert torch.equal(layer.experts.gate_up_proj, torch.cat((gate, up), dim=1))
        assert torch.equal(layer.gate.weight, full.model.layers[1].mlp.gate.weight)  # the router: whole


def test_expert_parallel_at_one_rank_is_the_whole_model(checkpoint: Path) -> None:
    """--enable-expert-parallel with one rank holds all 8 experts whole: the same parameters as without."""
    single = ModelRunner(checkpoint, CPU, 8, 4).model
    flagged = replace(TensorParallel.SINGLE, expert_parallel=True)
    model = ModelRunner(checkpoint, CPU, 8, 4, parallel=flagged).model
    for (name, p), q in zip(model.named_parameters(), single.parameters(), strict=True):
        assert torch.equal(p, q), name
