"""Verification: greedy longest-prefix acceptance; rejection sampling keeps the target distribution."""

from __future__ import annotations

import torch

from openinfer.kernels.verification import processed_probs, verify, verify_greedy, verify_sampled


def test_greedy_accepts_longest_matching_prefix_plus_one() -> None:
    """Drafts [5, 6, 7] against argmax [5, 6, 9, 2]: 2 accepted, then the target's 9."""
    assert verify_greedy([5, 6, 9, 2], [5, 6, 7]) == [5, 6, 9]
    assert verify_greedy([5, 6, 7, 2], [5, 6, 7]) == [5, 6, 7, 2]  # all accepted + bonus
    assert verify_greedy([4, 1], [5]) == [4]
    assert verify_greedy([3], []) == [3]  # no draft: plain greedy


def test_verify_batches_requests_with_and_without_drafts() -> None:
    """Rows are consumed per request (len(drafts) + 1 each); greedy rows take the argmax."""
    vocab = 10
    targets = [[2, 3, 4], [7], [1, 1]]  # argmax per verified row, per request
    rows = [t for req in targets for t in req]
    logits = torch.full((len(rows), vocab), -5.0)
    logits[torch.arange(len(rows)), torch.tensor(rows)] = 5.0
    out = verify(logits, [[2, 9], [], [1]], [0.0, 0.0, 0.0], [None] * 3, [1.0] * 3, [None] * 3)
    assert out == [[2, 3], [7], [1, 1]]


def test_processed_probs_top_k_top_p() -> None:
    """top_k and top_p restrict the distribution exactly as the sampler does, in vocabulary order."""
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3]]))
    assert torch.allclose(processed_probs(logits, 1.0, None, 1.0), torch.tensor([[0.1, 0.6, 0.3]]))
    assert torch.allclose(processed_probs(logits, 1.0, 2, 1.0), torch.tensor([[0.0, 2 / 3, 1 / 3]]))
    assert torch.allclose(processed_probs(logits, 1.0, None, 0.5), torch.tensor([[0.0, 1.0, 0.0]]))


def test_rejection_sampling_keeps_the_target_distribution() -> None:
    """Whatever the (deterministic) draft, each output position is distributed as the target's p.

    Empirical check on a 4-token vocabulary: 20,000 rounds, total-variation distance to p below 0.02
    (the expected TV of 20k samples over 4 outcomes is about 0.006).
    """
    generator = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.4, 0.4]])
    for draft in ([3, 2], [0, 1], [1, 1]):
        first = torch.zeros(4)
        second = torch.zeros(4)
        num_second = 0
        for _ in range(20_000):
            out = verify_sampled(torch.cat([p, p[:1]]), draft, generator)
            first[out[0]] += 1
            if len(out) > 1:  # position 1 exists only when position 0 was accepted
                second[out[1]] += 1
                num_second += 1
        assert 0.5 * (first / first.sum() - p[0]).abs().sum() < 0.02
        # Given the draft's first token was accepted, position 1 is still distributed as p[1].
        assert num_second > 1000 and 0.5 * (second / num_second - p[1]).abs().sum() < 0.03


def test_acceptance_rate_is_p_of_draft() -> None:
    """A draft token is accepted with probability p(token) (q = 1): 0.2 here, within 0.01 over 20k rounds."""
    generator = torch.Generator().manual_seed(1)
    probs = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    accepted = sum(len(verify_sampled(probs, [1], generator)) == 2 for _ in range(20_000))
    assert abs(accepted / 20_000 - 0.2) < 0.01
