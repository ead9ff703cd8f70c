"""The logits processors' device ops against transformers' processors and OpenAI's penalty formula, on random
logits and histories (no drafts here: the per-row histories are tests/engine_core/sample/test_logits_plan.py's)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor

from openinfer.kernels.logits_processors import LogitsPlan, apply_plan
from openinfer.kernels.sampling import SamplingBatch, processed_probs

V = 64


def ints(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def floats(values: list[float]) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def penalty_plan(
    outputs: list[list[int]], prompts: list[list[int]], presence: float, frequency: float, repetition: float
) -> LogitsPlan:
    """Row r penalised for outputs[r] (and prompts[r] when repetition != 1): one pair per seen token."""
    rows, tokens, offsets = [], [], []
    for r, (output, prompt) in enumerate(zip(outputs, prompts, strict=True)):
        counts = Counter(output)
        for token in sorted(set(output) | (set(prompt) if repetition != 1.0 else set())):
            rows.append(r)
            tokens.append(token)
            offsets.append(frequency * counts[token] + (presence if counts[token] else 0.0))
    return LogitsPlan(
        ints([]), ints([]), ints([]), ints([]), floats([]),
        ints(rows), ints(tokens), floats([repetition] * len(rows)), floats(offsets),
    )  # fmt: skip


def random_histories(seed: int, n: int) -> tuple[torch.Tensor, list[list[int]], list[list[int]]]:
    """Logits (n, V) with both signs, and per row a prompt and an output drawn from a small part of V (so
    that tokens repeat)."""
    rng = random.Random(seed)
    logits = torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 3
    prompts = [[rng.randrange(V // 2) for _ in range(rng.randrange(1, 20))] for _ in range(n)]
    outputs = [[rng.randrange(V // 2) for _ in range(rng.randrange(0, 30))] for _ in range(n)]
    return logits, prompts, outputs


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_is_transformers(penalty: float) -> None:
    """Over prompt + output, positive logits divided and the others multiplied: transformers' processor."""
    logits, prompts, outputs = random_histories(1, 8)
    processed = logits.clone()
    apply_plan(processed, penalty_plan(outputs, prompts, 0.0, 0.0, penalty))
    hf = RepetitionPenaltyLogitsProcessor(penalty)
    for r in range(8):
        expected = hf(torch.tensor([prompts[r] + outputs[r]]), logits[r : r + 1].clone())[0]
        assert torch.allclose(processed[r], expected, rtol=1e-6, atol=0), r


@pytest.mark.parametrize(("presence", "frequency"), [(0.7, 0.0), (0.0, -1.2), (-2.0, 2.0)])
def test_presence_and_frequency_penalties_are_openais_formula(presence: float, frequency: float) -> None:
    """logit[t] - frequency * count[t] - presence * (count[t] > 0), counts over the output only (a token only
    in the prompt is untouched)."""
    logits, prompts, outputs = random_histories(2, 8)
    processed = logits.clone()
    apply_plan(processed, penalty_plan(outputs, prompts, presence, frequency, 1.0))
    expected = logits.clone()
    for r, output in enumerate(outputs):
        for token, count in Counter(output).items():
            expected[r, token] -= frequency * count + presence
    assert torch.allclose(processed, expected, rtol=0, atol=1e-5)


def test_logit_bias_is_transformers_sequence_bias_and_masks_are_minus_infinity() -> None:
    """A bias on one token is transformers' one-token sequence bias; masked tokens are -inf whatever else
    applies; rows the plan does not name are untouched."""
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(3))
    bias = {5: 100.0, 9: -100.0, 11: 0.25}
    plan = LogitsPlan(
        ints([0, 2]), ints([9, 7]),  # masks: row 0 token 9 (biased too), row 2 token 7
        ints([0] * 3 + [2] * 3), ints(list(bias) * 2), floats(list(bias.values()) * 2),
        ints([]), ints([]), floats([]), floats([]),
    )  # fmt: skip
    processed = logits.clone()
    apply_plan(processed, plan)
    hf = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])
    expected = hf(torch.zeros(3, 1, dtype=torch.int64), logits.clone())
    expected[1] = logits[1]  # not a planned row
    expected[0, 9] = expected[2, 7] = float("-inf")
    assert torch.allclose(processed, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("filtered", [False, True], ids=["softmax", "sorted"])
@pytest.mark.parametrize(("min_p", "temperature"), [(0.05, 1.0), (0.3, 0.7), (0.9, 1.5), (1.0, 1.0)])
def test_min_p_after_temperature_is_transformers(min_p: float, temperature: float, filtered: bool) -> None:
    """min-p on the tempered distribution, renormalised: softmax(MinPLogitsWarper(logits / T)), on both paths
    of the sampler (a plain softmax, and the sorted one top-k/top-p take)."""
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(4)) * 4
    n = logits.shape[0]
    probs = processed_probs(
        logits,
        torch.full((n,), temperature),
        torch.full((n,), V),
        torch.ones(n),
        filtered,
        torch.full((n,), min_p),
    )
    no_ids = torch.LongTensor(n, 0)  # min-p reads no token ids
    expected = MinPLogitsWarper(min_p)(no_ids, logits / temperature).softmax(-1)
    assert torch.allclose(probs, expected, rtol=0, atol=1e-6)
    assert (probs > 0).sum() < n * V  # it dropped tokens


def test_min_p_applies_only_where_set() -> None:
    """In one batch, a row without min_p keeps its whole distribution; a greedy batch ignores min_p."""
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(5)) * 4
    batch = SamplingBatch.build([1.0, 1.0], [None, None], [1.0, 1.0], [None, None], V, min_ps=[0.0, 0.5])
    probs = batch.probs(logits, [0, 1], 1)
    assert torch.allclose(probs[0], logits[0].softmax(-1), atol=1e-7)
    assert 0 < (probs[1] > 0).sum() < V
    assert SamplingBatch.build([1.0], [None], [1.0], [None], V, min_ps=[0.0]).min_ps is None  # all off
