"""The step's logits processing, row by row: each verified row processed as transformers' processors (and
OpenAI's penalty formula) would process the sequence that row continues, drafts before it included."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from transformers import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from openinfer.engine_core.request import Request
from openinfer.engine_core.sample.logits_plan import check_logits_params, plan_logits, processed_logits
from openinfer.engine_core.scheduler_output import ScheduledRequest, SchedulerOutput
from openinfer.protocol import SamplingParams

V = 48
STOP_IDS = frozenset({0, 7})  # EOS and a stop_token_id


def scheduled(prompt: list[int], output: list[int], drafts: list[int], **options: object) -> ScheduledRequest:
    """A request whose prompt and output are computed but its last token, verifying ``drafts`` this step."""
    params = SamplingParams(max_tokens=100, **options)  # type: ignore[arg-type]
    request = Request("r", prompt, params, 0.0, 1000, all_token_ids=prompt + output, stop_ids=STOP_IDS)
    request.num_computed_tokens = request.num_tokens - 1
    return ScheduledRequest(request, request.num_computed_tokens, 1, tuple(drafts), True, False)


def rows_of(step: list[ScheduledRequest]) -> tuple[list[ScheduledRequest], list[int]]:
    """The step's sampling requests and their first logits rows, as the scheduler lays them out."""
    decided = SchedulerOutput.of(step)
    return decided.sampling, decided.logits_starts


def expected_row(logits: torch.Tensor, s: ScheduledRequest, j: int) -> torch.Tensor:
    """transformers' chain for the sequence row j continues: prompt, output, drafts[:j]; in vLLM's order
    (masks, bias, penalties). Bad words look at the output only (vLLM), so they get the output ids."""
    request = s.request
    params = request.sampling_params
    output = request.all_token_ids[request.num_prompt_tokens :] + list(s.spec_token_ids[:j])
    sequence = torch.tensor([request.prompt_token_ids + output])
    row = logits[None].clone()
    if params.bad_words_token_ids and output:
        row = NoBadWordsLogitsProcessor(params.bad_words_token_ids)(torch.tensor([output]), row)
    elif params.bad_words_token_ids:  # nothing out yet: only one-token words apply
        row[0, [w[0] for w in params.bad_words_token_ids if len(w) == 1]] = float("-inf")
    if params.min_tokens:
        prompt_length = len(request.prompt_token_ids)
        row = MinNewTokensLengthLogitsProcessor(prompt_length, params.min_tokens, sorted(STOP_IDS))(
            sequence, row
        )
    if params.logit_bias:
        row = SequenceBiasLogitsProcessor([[[t], b] for t, b in params.logit_bias.items()])(sequence, row)
    if params.repetition_penalty != 1.0:
        row = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(sequence, row)
    for token, count in Counter(output).items():
        row[0, token] -= params.frequency_penalty * count + (params.presence_penalty if count else 0.0)
    return row[0]


def random_step(seed: int) -> list[ScheduledRequest]:
    """Eight requests, each with every processor at random strengths, repetitive outputs and 0..5 drafts;
    bad words are built from the output and drafts so that some of them apply."""
    rng = random.Random(seed)
    step = []
    for _ in range(8):
        prompt = [rng.randrange(1, V) for _ in range(rng.randrange(1, 12))]
        output = [rng.randrange(1, 12) for _ in range(rng.randrange(0, 10))]
        drafts = [rng.randrange(1, 12) for _ in range(rng.randrange(0, 6))]
        seen = output + drafts or [3]
        words = [[rng.choice(seen)], [rng.choice(seen), rng.choice(seen)], seen[-3:]]
        step.append(
            scheduled(
                prompt, output, drafts,
                presence_penalty=rng.uniform(-2, 2), frequency_penalty=rng.uniform(-2, 2),
                repetition_penalty=rng.choice([0.6, 1.0, 1.7]), min_tokens=rng.randrange(0, 12),
                logit_bias={rng.randrange(V): rng.uniform(-100, 100) for _ in range(3)},
                bad_words_token_ids=words,
            )
        )  # fmt: skip
    return step


@pytest.mark.parametrize("seed", range(4))
def test_every_row_is_processed_as_transformers_would_its_sequence(seed: int) -> None:
    """Random logits and histories: row j of each request equals transformers' processors (and OpenAI's
    formula) applied to prompt + output + drafts[:j]; -inf exactly where they put it."""
    step = random_step(seed)
    num_rows = sum(len(s.spec_token_ids) + 1 for s in step)
    logits = torch.randn(num_rows, V, generator=torch.Generator().manual_seed(seed)) * 5
    processed = processed_logits(logits.clone(), *rows_of(step))
    row = 0
    for s in step:
        for j in range(len(s.spec_token_ids) + 1):
            expected = expected_row(logits[row], s, j)
            assert torch.equal(processed[row].isinf(), expected.isinf()), (row, j)
            assert torch.allclose(processed[row], expected, rtol=1e-5, atol=1e-4), (row, j)
            row += 1


def test_requests_without_processors_cost_nothing_and_keep_their_rows() -> None:
    """No request with a processor: no plan, the same tensor back. Beside one that has them, other rows stay
    bit for bit, and a request that already has min_tokens out plans nothing."""
    plain = scheduled([5, 6], [7, 8], [9, 10])
    assert plan_logits(*rows_of([plain, plain])) is None
    logits = torch.randn(4, V)
    assert processed_logits(logits, *rows_of([plain, scheduled([5], [1], [])])) is logits
    assert plan_logits(*rows_of([scheduled([5], [1, 2, 3], [4], min_tokens=2)])) is None  # min_tokens reached
    mixed = [plain, scheduled([5], [1], [2], presence_penalty=1.0), plain]
    before = torch.randn(8, V)
    after = processed_logits(before.clone(), *rows_of(mixed))
    assert torch.equal(after[:3], before[:3]) and torch.equal(after[5:], before[5:])
    assert not torch.equal(after[3:5], before[3:5])
    biased = processed_logits(before[:1].clone(), *rows_of([scheduled([5], [1], [], logit_bias={3: 1.5})]))
    assert torch.allclose(biased - before[:1], torch.eye(V)[3] * 1.5)  # a bias alone, no penalties


def test_min_tokens_masks_stop_tokens_up_to_its_count_inside_the_drafts() -> None:
    """3 tokens out, min_tokens 5, 4 drafts: rows 0 and 1 sample tokens 4 and 5, so they mask EOS and the
    stop token; rows 2..4 do not."""
    plan = plan_logits(*rows_of([scheduled([9], [1, 2, 3], [4, 5, 6, 8], min_tokens=5)]))
    assert plan is not None
    assert sorted(zip(plan.mask_rows.tolist(), plan.mask_tokens.tolist(), strict=True)) == [
        (0, 0), (0, 7), (1, 0), (1, 7)
    ]  # fmt: skip


def test_bad_word_context_runs_through_the_drafts() -> None:
    """Word [4, 5]: its 5 is masked after each 4, an output token or a draft; word [6]: everywhere. The
    prompt is no context: a prompt ending in 4 masks nothing at the first output token."""
    plan = plan_logits(*rows_of([scheduled([1], [3, 4], [5, 4, 2], bad_words_token_ids=[[4, 5], [6]])]))
    assert plan is not None
    masked = sorted(zip(plan.mask_rows.tolist(), plan.mask_tokens.tolist(), strict=True))
    assert masked == [(0, 5), (0, 6), (1, 6), (2, 5), (2, 6), (3, 6)]
    first = plan_logits(*rows_of([scheduled([4], [], [], bad_words_token_ids=[[4, 5]])]))
    assert first is None or first.mask_rows.size == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2]"),
        ({"frequency_penalty": -3.0}, "frequency_penalty must be in [-2, 2]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0"),
        ({"min_p": 1.5}, "min_p must be in [0, 1]"),
        ({"min_tokens": 101}, "min_tokens must be in [0, max_tokens=100]"),
        ({"logit_bias": {V: 1.0}}, "logit_bias token ids"),
        ({"stop_token_ids": [V]}, "stop_token_ids must be in [0, 48)"),
        ({"bad_words_token_ids": [[]]}, "bad_words_token_ids"),
        ({"bad_words_token_ids": [[1, V]]}, "bad_words_token_ids"),
    ],
)
def test_engine_refuses_out_of_range_params(options: dict[str, object], message: str) -> None:
    """The engine checks what the frontend checked (another client may send anything): vLLM's ranges."""
    params = SamplingParams(max_tokens=100, **options)  # type: ignore[arg-type]
    error = check_logits_params(params, V)
    assert error is not None and message in error
    assert check_logits_params(SamplingParams(max_tokens=100), V) is None
