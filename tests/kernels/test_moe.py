"""kernels/moe.py's torch path: the grouped experts equal the per-token, per-choice sum they stand for."""

from __future__ import annotations

import pytest
import torch

from openinfer.kernels.moe import grouped_experts, naive_experts

E, H, WIDTH, K = 8, 32, 24, 3  # experts, hidden, expert width (I), top-k


def random_routing(num_tokens: int, experts_used: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids (T, K): K distinct experts per token drawn from experts_used; topk_weights (T, K) float32."""
    g = torch.Generator().manual_seed(seed)
    used = torch.tensor(experts_used)
    ids = torch.stack([used[torch.randperm(len(used), generator=g)[:K]] for _ in range(num_tokens)])
    return torch.rand(num_tokens, K, generator=g), ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 5, 64])
def test_grouped_experts_equal_the_naive_sum(dtype: torch.dtype, num_tokens: int) -> None:
    """Random routings over 5 of 8 experts (experts 1, 4, 6 picked by no token): grouped == naive."""
    g = torch.Generator().manual_seed(num_tokens)
    hidden = torch.randn(num_tokens, H, generator=g).to(dtype)
    w13 = (torch.randn(E, 2 * WIDTH, H, generator=g) * 0.2).to(dtype)
    w2 = (torch.randn(E, H, WIDTH, generator=g) * 0.2).to(dtype)
    weights, ids = random_routing(num_tokens, [0, 2, 3, 5, 7], seed=num_tokens)
    out = grouped_experts(hidden, w13, w2, weights, ids)  # the CPU runs the grouped path
    expected = naive_experts(hidden, w13, w2, weights, ids)
    assert out.dtype == dtype and out.shape == (num_tokens, H)
    # float32: summation order only; bfloat16: one rounding of the (T, I) activations differs at most
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out.float(), expected.float(), rtol=tolerance, atol=tolerance)


def test_a_zero_weight_choice_adds_nothing() -> None:
    """A choice of weight 0 leaves the token's output as if that expert were not routed (exact, float32)."""
    g = torch.Generator().manual_seed(0)
    hidden, w13, w2 = (
        torch.randn(4, H, generator=g),
        torch.randn(E, 2 * WIDTH, H, generator=g),
        torch.randn(E, H, WIDTH),
    )
    ids = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]])
    weights = torch.tensor([[1.0, 0.0]] * 4)
    single = grouped_experts(hidden, w13, w2, weights[:, :1], ids[:, :1])
    assert torch.equal(grouped_experts(hidden, w13, w2, weights, ids), single)


@pytest.mark.parametrize("num_tokens", [1, 6])
def test_a_pair_of_id_e_adds_nothing(num_tokens: int) -> None:
    """Id E (past the last expert: another rank's, under expert parallelism) adds nothing, whatever its
    weight: the sum equals the one without that choice, in the grouped and the naive path (exact, float32)."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(num_tokens, H, generator=g)
    w13, w2 = torch.randn(E, 2 * WIDTH, H, generator=g), torch.randn(E, H, WIDTH, generator=g)
    weights, ids = random_routing(num_tokens, list(range(E)), seed=2)
    absent = ids.clone()
    absent[:, -1] = E  # every token's last choice held elsewhere
    for experts in (grouped_experts, naive_experts):
        kept = experts(hidden, w13, w2, weights[:, :-1], ids[:, :-1])
        assert torch.equal(experts(hidden, w13, w2, weights, absent), kept)
