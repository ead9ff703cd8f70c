"""vLLM's logits processors on the device: bad-word and min_tokens masks, logit bias, and the repetition,
frequency and presence penalties, over some rows of one step's logits (min_p is the sampler's: it comes after
temperature).

Each row has a history of its own: at a draft position, the drafts before it count as output tokens, so
verification compares each draft with the distribution it would have been sampled from. The host plans what
to do (:class:`LogitsPlan`, plain arrays); :func:`apply_plan` copies it to the device in two transfers and
applies it in a few batched ops, reading nothing back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from openinfer.kernels.attention import host_to_device_parts

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float32]


@dataclass(frozen=True)
class Penalties:
    """The penalised rows of one step, and the tokens each is penalised for.

    Row i (logits row ``rows[i]``) belongs to penalised request ``requests[i]`` in [0, num_requests). Its
    output history is that request's output tokens, then its own preceding drafts; its prompt is the
    request's (listed only for requests with a repetition penalty).
    """

    rows: IntArray  # (P,) logits rows
    requests: IntArray  # (P,) in [0, num_requests)
    presence: FloatArray  # (P,) subtracted once from each token in the output history
    frequency: FloatArray  # (P,) subtracted per occurrence in the output history
    repetition: FloatArray  # (P,) > 0: divides positive logits and multiplies the others of seen tokens
    output_requests: IntArray  # (H,) with output_tokens: one (request, token) pair per output token
    output_tokens: IntArray  # (H,)
    draft_rows: IntArray  # (D,) in [0, P) with draft_tokens: one pair per draft before a row
    draft_tokens: IntArray  # (D,)
    prompt_requests: IntArray  # (Q,) with prompt_tokens: one pair per prompt token
    prompt_tokens: IntArray  # (Q,)
    num_requests: int


@dataclass(frozen=True)
class LogitsPlan:
    """What one step does to its logits before sampling, in vLLM's order: masks (-inf at bad words' last
    tokens and at stop tokens under min_tokens), then logit bias, then penalties."""

    mask_rows: IntArray  # (M,) with mask_tokens: -inf at (row, token)
    mask_tokens: IntArray  # (M,)
    bias_rows: IntArray  # (B,) with bias_tokens and bias_values: + value at (row, token), pairs unique
    bias_tokens: IntArray  # (B,)
    bias_values: FloatArray  # (B,)
    penalties: Penalties | None  # None: no row is penalised


def apply_plan(logits: Tensor, plan: LogitsPlan) -> None:
    """Apply ``plan`` to ``logits`` (N, V) float32 in place; every index in it is in range."""
    penalties = plan.penalties
    ints = [plan.mask_rows, plan.mask_tokens, plan.bias_rows, plan.bias_tokens]
    floats = [plan.bias_values]
    if penalties is not None:
        ints += [
            penalties.rows, penalties.requests, penalties.output_requests, penalties.output_tokens,
            penalties.draft_rows, penalties.draft_tokens, penalties.prompt_requests, penalties.prompt_tokens,
        ]  # fmt: skip
        floats += [penalties.presence, penalties.frequency, penalties.repetition]
    device = logits.device
    int_parts = host_to_device_parts(np.concatenate(ints), [len(a) for a in ints], device)
    float_parts = host_to_device_parts(np.concatenate(floats), [len(a) for a in floats], device)
    mask_rows, mask_tokens, bias_rows, bias_tokens = int_parts[:4]
    if len(plan.mask_rows):
        logits.index_put_((mask_rows, mask_tokens), logits.new_full((), float("-inf")))
    if len(plan.bias_rows):
        logits.index_put_((bias_rows, bias_tokens), float_parts[0], accumulate=True)
    if penalties is not None:
        rows, requests, *pairs = int_parts[4:]
        counts = output_counts(logits.shape[1], penalties.num_requests, requests, *pairs[:4])  # (P, V)
        seen = counts > 0
        if len(penalties.prompt_tokens):
            in_prompt = torch.zeros(penalties.num_requests, logits.shape[1], dtype=torch.bool, device=device)
            in_prompt.index_put_((pairs[4], pairs[5]), in_prompt.new_ones(()))
            seen = seen | in_prompt[requests]
        presence, frequency, repetition = float_parts[1:]
        logits[rows] = penalize(logits[rows], counts, seen, presence, frequency, repetition)


def output_counts(
    vocab_size: int,
    num_requests: int,
    requests: Tensor,
    output_requests: Tensor,
    output_tokens: Tensor,
    draft_rows: Tensor,
    draft_tokens: Tensor,
) -> Tensor:
    """(P, V) float32: how often each token occurs in each row's output history (see :class:`Penalties`)."""
    counts = torch.zeros(num_requests, vocab_size, dtype=torch.float32, device=requests.device)
    counts.index_put_((output_requests, output_tokens), counts.new_ones(()), accumulate=True)
    rows = counts[requests]  # (P, V): each row starts from its request's output
    rows.index_put_((draft_rows, draft_tokens), rows.new_ones(()), accumulate=True)
    return rows


def penalize(
    logits: Tensor, counts: Tensor, seen: Tensor, presence: Tensor, frequency: Tensor, repetition: Tensor
) -> Tensor:
    """The penalised logits (P, V): repetition over ``seen`` tokens (prompt or output), then OpenAI's
    ``logit - frequency * count - presence * (count > 0)`` over the output counts (P, V)."""
    scale = torch.where(seen, repetition[:, None], 1.0)  # (P, V)
    logits = torch.where(logits > 0, logits / scale, logits * scale)
    return logits - frequency[:, None] * counts - presence[:, None] * (counts > 0)
