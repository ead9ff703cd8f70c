"""vLLM's logits processors on the device: bad-word and min_tokens masks, logit bias, and the repetition,
frequency and presence penalties, over some rows of one step's logits (min_p is the sampler's: it comes after
temperature).

Each row has a history of its own: at a draft position, the drafts before it count as output tokens, so
verification compares each draft with the distribution it would have been sampled from. The host plans what
to do (:class:`LogitsPlan`, plain lists); :func:`apply_plan` copies it to the device in two transfers and
applies it in a few batched ops, reading nothing back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from openinfer.kernels.attention import host_to_device_parts


@dataclass
class Penalties:
    """The penalised rows of one step, and the tokens each is penalised for.

    Row i (logits row ``rows[i]``) belongs to penalised request ``requests[i]`` in [0, num_requests). Its
    output history is that request's output tokens, then its own preceding drafts; its prompt is the
    request's (listed only for requests with a repetition penalty). Plain lists, filled by the planner.
    """

    rows: list[int]  # (P,) logits rows
    requests: list[int]  # (P,) in [0, num_requests)
    presence: list[float]  # (P,) subtracted once from each token in the output history
    frequency: list[float]  # (P,) subtracted per occurrence in the output history
    repetition: list[float]  # (P,) > 0: divides positive logits and multiplies the others of seen tokens
    output_requests: list[int]  # (H,) with output_tokens: one (request, token) pair per output token
    output_tokens: list[int]  # (H,)
    draft_rows: list[int]  # (D,) in [0, P) with draft_tokens: one pair per draft before a row
    draft_tokens: list[int]  # (D,)
    prompt_requests: list[int]  # (Q,) with prompt_tokens: one pair per prompt token
    prompt_tokens: list[int]  # (Q,)
    num_requests: int


@dataclass(frozen=True)
class LogitsPlan:
    """What one step does to its logits before sampling, in vLLM's order: masks (-inf at bad words' last
    tokens and at stop tokens under min_tokens), then logit bias, then penalties."""

    mask_rows: list[int]  # (M,) with mask_tokens: -inf at (row, token)
    mask_tokens: list[int]  # (M,)
    bias_rows: list[int]  # (B,) with bias_tokens and bias_values: + value at (row, token), pairs unique
    bias_tokens: list[int]  # (B,)
    bias_values: list[float]  # (B,)
    penalties: Penalties | None  # None: no row is penalised


def apply_plan(logits: Tensor, plan: LogitsPlan) -> None:
    """Apply ``plan`` to ``logits`` (N, V) float32 in place; every index in it is in range."""
    p = plan.penalties
    ints = [plan.mask_rows, plan.mask_tokens, plan.bias_rows, plan.bias_tokens]
    floats = [plan.bias_values]
    if p is not None:
        ints += [p.rows, p.requests, p.output_requests, p.output_tokens, p.draft_rows, p.draft_tokens,
                 p.prompt_requests, p.prompt_tokens]  # fmt: skip
        floats += [p.presence, p.frequency, p.repetition]
    device = logits.device
    int_parts = _to_device(ints, np.int64, device)
    float_parts = _to_device(floats, np.float32, device)
    mask_rows, mask_tokens, bias_rows, bias_tokens = int_parts[:4]
    if plan.mask_rows:
        logits.index_put_((mask_rows, mask_tokens), logits.new_full((), float("-inf")))
    if plan.bias_rows:
        logits.index_put_((bias_rows, bias_tokens), float_parts[0], accumulate=True)
    if p is None:
        return
    rows, requests, output_requests, output_tokens, draft_rows, draft_tokens, *prompt = int_parts[4:]
    vocab_size = logits.shape[1]
    counts = output_counts(
        vocab_size, p.num_requests, requests, output_requests, output_tokens, draft_rows, draft_tokens,
        has_drafts=bool(p.draft_rows),
    )  # fmt: skip
    in_output = counts > 0  # (P, V)
    presence, frequency, repetition = float_parts[1:]
    penalised = logits[rows]  # (P, V)
    if any(r != 1.0 for r in p.repetition):
        seen = in_output
        if p.prompt_tokens:
            in_prompt = torch.zeros(p.num_requests, vocab_size, dtype=torch.bool, device=device)
            in_prompt.index_put_((prompt[0], prompt[1]), in_prompt.new_ones(()))
            seen = seen | (in_prompt[requests] if p.draft_rows else in_prompt)
        penalised = repetition_penalized(penalised, seen, repetition)
    if any(p.frequency):
        penalised -= frequency[:, None] * counts
    if any(p.presence):
        penalised -= presence[:, None] * in_output
    logits[rows] = penalised


def _to_device(parts: list[list[int]] | list[list[float]], dtype: type, device: torch.device) -> list[Tensor]:
    """The lists as tensors on ``device``, through one array and one copy."""
    packed: np.ndarray = np.array([x for part in parts for x in part], dtype=dtype)
    return host_to_device_parts(packed, [len(part) for part in parts], device)


def output_counts(
    vocab_size: int,
    num_requests: int,
    requests: Tensor,
    output_requests: Tensor,
    output_tokens: Tensor,
    draft_rows: Tensor,
    draft_tokens: Tensor,
    has_drafts: bool = True,
) -> Tensor:
    """(P, V) float32: how often each token occurs in each row's output history (see :class:`Penalties`);
    ``has_drafts`` False: no row follows a draft, row i is request i's."""
    counts = torch.zeros(num_requests, vocab_size, dtype=torch.float32, device=requests.device)
    counts.index_put_((output_requests, output_tokens), counts.new_ones(()), accumulate=True)
    if not has_drafts:
        return counts
    rows = counts[requests]  # (P, V): each row starts from its request's output
    rows.index_put_((draft_rows, draft_tokens), rows.new_ones(()), accumulate=True)
    return rows


def repetition_penalized(logits: Tensor, seen: Tensor, repetition: Tensor) -> Tensor:
    """``logits`` (P, V) with the repetition penalty (P,) over the ``seen`` tokens (P, V) bool, those of the
    prompt or the output: positive logits divided by it, the others multiplied (vLLM's and transformers')."""
    scale = torch.where(seen, repetition[:, None], 1.0)  # (P, V)
    return torch.where(logits > 0, logits / scale, logits * scale)
