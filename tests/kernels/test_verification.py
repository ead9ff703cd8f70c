"""Verification: greedy longest-prefix acceptance; rejection sampling keeps the target distribution."""

from __future__ import annotations

import torch

from openinfer.kernels.sampling import SamplingBatch, processed_probs
from openinfer.kernels.verification import verify, verify_on_device


def batch_of(
    n: int, temperature: float, vocab: int, generator: torch.Generator | None = None
) -> SamplingBatch:
    """n requests alike: no top-k or top-p, one shared generator."""
    return SamplingBatch.build([temperature] * n, [None] * n, [1.0] * n, [generator] * n, vocab)


def one_hot_logits(argmax: list[int], vocab: int = 10) -> torch.Tensor:
    logits = torch.full((len(argmax), vocab), -5.0)
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] = 5.0
    return logits


def verify_greedy(argmax: list[int], drafts: list[int]) -> list[int]:
    return verify(one_hot_logits(argmax), [drafts], batch_of(1, 0.0, 10))[0]


def test_greedy_accepts_longest_matching_prefix_plus_one() -> None:
    """Drafts [5, 6, 7] against argmax [5, 6, 9, 2]: 2 accepted, then the target's 9."""
    assert verify_greedy([5, 6, 9, 2], [5, 6, 7]) == [5, 6, 9]
    assert verify_greedy([5, 6, 7, 2], [5, 6, 7]) == [5, 6, 7, 2]  # all accepted + bonus
    assert verify_greedy([4, 1], [5]) == [4]
    assert verify_greedy([3], []) == [3]  # no draft: plain greedy


def test_verify_batches_requests_with_and_without_drafts() -> None:
    """Rows are consumed per request (len(drafts) + 1 each); greedy rows take the argmax."""
    targets = [[2, 3, 4], [7], [1, 1]]  # argmax per verified row, per request
    logits = one_hot_logits([t for req in targets for t in req])
    out = verify(logits, [[2, 9], [], [1]], batch_of(3, 0.0, 10))
    assert out == [[2, 3], [7], [1, 1]]


def test_greedy_and_sampled_requests_in_one_batch() -> None:
    """A sampled request beside greedy ones leaves theirs untouched; its draft, certain under p, is kept."""
    logits = one_hot_logits([2, 3, 4, 7, 1, 1], vocab=10) * 10  # p(argmax) = 1 - 1e-43: drafts accepted
    batch = SamplingBatch.build([0.0, 1.0, 0.0], [None] * 3, [1.0] * 3, [None] * 3, 10)
    out = verify(logits, [[2, 9], [], [1]], batch)
    assert out == [[2, 3], [7], [1, 1]]


def test_processed_probs_top_k_top_p() -> None:
    """top_k and top_p restrict the distribution exactly as the sampler does, in vocabulary order."""
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3]]))
    one = torch.ones(1)

    def probs(top_k: int, top_p: float, filtered: bool = True) -> torch.Tensor:
        return processed_probs(logits, one, torch.tensor([top_k]), torch.tensor([top_p]), filtered)

    assert torch.allclose(probs(3, 1.0), torch.tensor([[0.1, 0.6, 0.3]]))
    assert torch.allclose(probs(3, 1.0, filtered=False), torch.tensor([[0.1, 0.6, 0.3]]))
    assert torch.allclose(probs(2, 1.0), torch.tensor([[0.0, 2 / 3, 1 / 3]]))
    assert torch.allclose(probs(3, 0.5), torch.tensor([[0.0, 1.0, 0.0]]))


def test_rejection_sampling_keeps_the_target_distribution() -> None:
    """Whatever the (deterministic) draft, each output position is distributed as the target's p.

    Empirical check on a 4-token vocabulary: 20,000 requests verified in one batch, total-variation distance
    to p below 0.02 (the expected TV of 20k samples over 4 outcomes is about 0.006).
    """
    n = 20_000
    generator = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.4, 0.4]])
    logits = torch.log(torch.cat([p, p[:1]])).repeat(n, 1)  # 3 verified rows per request
    for draft in ([3, 2], [0, 1], [1, 1]):
        out = verify(logits, [draft] * n, batch_of(n, 1.0, 4, generator))
        first = torch.bincount(torch.tensor([o[0] for o in out]), minlength=4).float()
        second_tokens = [o[1] for o in out if len(o) > 1]  # position 1 exists only when 0 was accepted
        second = torch.bincount(torch.tensor(second_tokens), minlength=4).float()
        assert 0.5 * (first / n - p[0]).abs().sum() < 0.02
        # Given the draft's first token was accepted, position 1 is still distributed as p[1].
        assert len(second_tokens) > 1000 and 0.5 * (second / len(second_tokens) - p[1]).abs().sum() < 0.03


def test_rejection_sampling_against_q_keeps_the_target_distribution() -> None:
    """Drafts drawn from q (a drafter sampling at T > 0) and verified against that q: each output position is
    distributed as p and a draft is accepted with probability sum(min(p, q)) (0.6 here). The same drafts
    verified against a one-hot q are lossless too (a mixture of fixed drafts) but accepted only with
    probability sum(p q) (0.22): what verifying against q buys.

    20,000 requests in one batch on a 4-token vocabulary; tolerances as in the test above."""
    n = 20_000
    generator = torch.Generator().manual_seed(2)
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.4, 0.4]])
    q = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]])
    drafts = torch.stack(
        [torch.multinomial(q[i], n, replacement=True, generator=generator) for i in (0, 1)], 1
    )
    logits = torch.log(torch.cat([p, p[:1]])).repeat(n, 1)

    def first_and_second(draft_probs: list[torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor]:
        out = verify(logits, drafts.tolist(), batch_of(n, 1.0, 4, generator), draft_probs=draft_probs)
        first = torch.bincount(torch.tensor([o[0] for o in out]), minlength=4).float() / n
        accepted = [o for o, d in zip(out, drafts.tolist(), strict=True) if len(o) > 1 and o[0] == d[0]]
        second = torch.bincount(torch.tensor([o[1] for o in accepted]), minlength=4).float()
        return first, second / max(1, len(accepted))

    first, second = first_and_second([q] * n)
    assert 0.5 * (first - p[0]).abs().sum() < 0.02
    assert 0.5 * (second - p[1]).abs().sum() < 0.03
    out = verify(logits, drafts.tolist(), batch_of(n, 1.0, 4, generator), draft_probs=[q] * n)
    rate = sum(len(o) > 1 for o in out) / n  # position 0 accepted: a second token follows
    assert abs(rate - torch.minimum(p[0], q[0]).sum().item()) < 0.015
    one_hot = verify(logits, drafts.tolist(), batch_of(n, 1.0, 4, generator))
    assert abs(sum(len(o) > 1 for o in one_hot) / n - (p[0] * q[0]).sum().item()) < 0.015


def test_acceptance_rate_is_p_of_draft() -> None:
    """A draft token is accepted with probability p(token) (q = 1): 0.2 here, within 0.01 over 20k requests."""
    n = 20_000
    generator = torch.Generator().manual_seed(1)
    probs = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    out = verify(torch.log(probs).repeat(n, 1), [[1]] * n, batch_of(n, 1.0, 4, generator))
    accepted = sum(len(o) == 2 for o in out)
    assert abs(accepted / n - 0.2) < 0.01


def test_seeded_requests_draw_alike_whatever_their_batch() -> None:
    """A request with its own seeded generator draws the same tokens alone or beside other requests."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(5)) / 4  # flat: drafts often rejected

    def own(seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    alone = verify(logits[:2], [[7]], SamplingBatch.build([1.0], [None], [1.0], [own(3)], 50))
    mixed = verify(
        torch.cat([logits[:2], logits]),
        [[7], [1, 2, 3]],  # a longer draft beside it changes nothing for the seeded request
        SamplingBatch.build([1.0, 0.8], [None, 5], [1.0, 0.9], [own(3), None], 50),
    )
    assert mixed[0] == alone[0]


def test_a_step_without_sampling_requests_verifies_nothing() -> None:
    """A step of prefill chunks only (no request samples) has no rows: nothing to verify."""
    assert verify(torch.empty(0, 10), [], batch_of(0, 0.0, 10)) == []


def test_greedy_counts_on_device_equal_the_host_walk() -> None:
    """Greedy acceptance counted on the device (for a drafter that proposes before the read-back) equals the
    host's walk over the argmax rows: drafts of mixed lengths, matching 0, some or all of their tokens."""
    targets = [[2, 3, 4], [7], [1, 1], [5, 6, 9, 8]]  # argmax per verified row, per request
    drafts = [[2, 3], [], [4], [5, 6, 7]]  # accepted: 2 (all), 0 (none drafted), 0, 2
    logits = one_hot_logits([t for req in targets for t in req])
    verified = verify_on_device(logits, drafts, batch_of(4, 0.0, 10))
    assert verified.num_accepted is None  # greedy: counted when read
    assert verified.accepted().tolist() == [2, 0, 0, 2]
    assert verify(logits, drafts, batch_of(4, 0.0, 10)) == [[2, 3, 4], [7], [1], [5, 6, 9]]
