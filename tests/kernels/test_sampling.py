"""Sampling: greedy, top-k, top-p, seeding and the exact sampling distribution."""

from __future__ import annotations

import math

import torch

from openinfer.kernels import verification
from openinfer.kernels.sampling import SamplingBatch


def sample(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ks: list[int | None],
    top_ps: list[float],
    generators: list[torch.Generator | None],
) -> list[int]:
    batch = SamplingBatch.build(temperatures, top_ks, top_ps, generators, logits.shape[1])
    return verification.sample(logits, batch)


def random_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def draw(
    logits: torch.Tensor,
    n: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[int]:
    """n samples from the single row `logits` (V,), one seeded generator shared by all n rows."""
    gen = seeded(seed)
    return sample(logits.expand(n, -1), [temperature] * n, [top_k] * n, [top_p] * n, [gen] * n)


def test_greedy_is_argmax() -> None:
    """Temperature 0 returns each row's argmax, whatever top_k/top_p say."""
    logits = random_logits(6, 50)
    tokens = sample(logits, [0.0] * 6, [None, 0, 3, None, 1, 5], [1.0, 0.5, 1.0, 0.1, 1.0, 0.9], [None] * 6)
    assert tokens == logits.argmax(-1).tolist()


def test_top_k_1_is_greedy() -> None:
    """top_k = 1 leaves only the argmax to draw, at any temperature."""
    logits = random_logits(5, 50, seed=1)
    tokens = sample(logits, [1.0, 2.0, 0.7, 5.0, 1.0], [1] * 5, [1.0] * 5, [seeded(i) for i in range(5)])
    assert tokens == logits.argmax(-1).tolist()


def test_mixed_batch_keeps_greedy_rows_greedy() -> None:
    """Greedy rows in a batch with sampled rows still get their argmax, and every token is in range."""
    logits = random_logits(4, 50, seed=2)
    tokens = sample(logits, [0.0, 1.0, 0.0, 1.0], [None] * 4, [1.0] * 4, [None, seeded(0), None, None])
    assert tokens[0] == logits[0].argmax().item() and tokens[2] == logits[2].argmax().item()
    assert all(0 <= t < 50 for t in tokens)


def test_same_seed_same_tokens() -> None:
    """Two runs with generators seeded alike draw the same tokens; another seed draws others."""
    logits = random_logits(1, 100, seed=3)[0]
    first, again, other = draw(logits, 64, seed=7), draw(logits, 64, seed=7), draw(logits, 64, seed=8)
    assert first == again
    assert first != other


def test_top_p_keeps_only_the_nucleus() -> None:
    """A token holding 0.9 of the mass is the whole nucleus for top_p = 0.5; with probabilities
    (0.5, 0.3, 0.15, 0.05), top_p = 0.9 keeps the first three (0.5 + 0.3 < 0.9 <= 0.95)."""
    dominant = torch.log(torch.tensor([0.9, 0.04, 0.03, 0.02, 0.01]))
    assert set(draw(dominant, 500, top_p=0.5)) == {0}
    tail = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert set(draw(tail, 2000, top_p=0.9)) == {0, 1, 2}


def total_variation(tokens: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).float()
    return 0.5 * (counts / len(tokens) - probs).abs().sum().item()


def test_empirical_distribution_at_temperature_1() -> None:
    """4000 draws at temperature 1 follow softmax(logits), with per-request generators and with the default
    one: total variation < 0.03 (its expected value at this size is about 0.01)."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    tokens = draw(torch.log(probs), 4000, seed=11)
    assert total_variation(tokens, probs) < 0.03
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        logits = torch.log(probs).expand(4000, -1)
        unseeded = sample(logits, [1.0] * 4000, [None] * 4000, [1.0] * 4000, [None] * 4000)
    assert total_variation(unseeded, probs) < 0.03


def test_empirical_distribution_with_temperature_and_top_k() -> None:
    """Temperature 0.5 squares-and-renormalises probabilities; top_k = 3 then drops the least likely token."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    tempered = probs**2 / (probs**2).sum()  # softmax(log p / 0.5)
    expected = torch.cat([torch.zeros(1), tempered[1:] / tempered[1:].sum()])
    tokens = draw(torch.log(probs), 4000, temperature=0.5, top_k=3, seed=12)
    assert 0 not in tokens
    assert total_variation(tokens, expected) < 0.03
    assert math.isclose(expected.sum().item(), 1.0, rel_tol=1e-6)
