"""vLLM's logits processors on the device: bad-word and min_tokens masks, logit bias, and the repetition,
frequency and presence penalties, over some rows of one step's logits (min_p is the sampler's: it comes after
temperature).

Each row has a history of its own: at a draft position, the drafts before it count as output tokens, so
verification compares each draft with the distribution it would have been sampled from. The host plans what
to do (:class:`LogitsPlan`: (row, token) pairs and their values); :func:`apply_plan` copies it to the device
in two transfers and applies it with a handful of ops whose size is the number of pairs, never the
vocabulary, reading nothing back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from openinfer.kernels.host_copy import host_to_device_parts

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float32]


@dataclass(frozen=True)
class LogitsPlan:
    """What one step does to its logits before sampling, in vLLM's order: masks (-inf at bad words' last
    tokens and at stop tokens under min_tokens), then logit bias, then penalties.

    A penalised pair is a token its row has seen (in the prompt, for a repetition penalty, or in the
    output history): its logit x becomes ``(x / scale if x > 0 else x * scale) - offset``, where scale is the
    repetition penalty and offset is OpenAI's ``frequency * count + presence * (count > 0)``.
    """

    mask_rows: IntArray  # (M,) with mask_tokens: -inf at (row, token)
    mask_tokens: IntArray  # (M,)
    bias_rows: IntArray  # (B,) with bias_tokens and bias_values: + value at (row, token), pairs distinct
    bias_tokens: IntArray  # (B,)
    bias_values: FloatArray  # (B,)
    penalty_rows: IntArray  # (Q,) with penalty_tokens: the penalised pairs, distinct
    penalty_tokens: IntArray  # (Q,)
    penalty_scales: FloatArray  # (Q,) > 0
    penalty_offsets: FloatArray  # (Q,)


def apply_plan(logits: Tensor, plan: LogitsPlan) -> None:
    """Apply ``plan`` to ``logits`` (N, V) float32 in place; every index in it is in range."""
    ints = [
        plan.mask_rows,
        plan.mask_tokens,
        plan.bias_rows,
        plan.bias_tokens,
        plan.penalty_rows,
        plan.penalty_tokens,
    ]
    floats = [plan.bias_values, plan.penalty_scales, plan.penalty_offsets]
    mask_rows, mask_tokens, bias_rows, bias_tokens, *pairs = _to_device(ints, logits.device)
    bias_values, scales, offsets = _to_device(floats, logits.device)
    if len(plan.mask_rows):
        logits.index_put_((mask_rows, mask_tokens), logits.new_full((), float("-inf")))
    if len(plan.bias_rows):
        logits.index_put_((bias_rows, bias_tokens), bias_values, accumulate=True)
    if len(plan.penalty_rows):
        rows, tokens = pairs
        logits.index_put_((rows, tokens), penalized(logits[rows, tokens], scales, offsets))


def penalized(logits: Tensor, scales: Tensor, offsets: Tensor) -> Tensor:
    """(Q,) logits of seen tokens after the repetition penalty (positive ones divided by ``scales``, the
    others multiplied: vLLM's and transformers' rule), then minus the frequency and presence ``offsets``."""
    return torch.where(logits > 0, logits / scales, logits * scales) - offsets


def _to_device(parts: list[IntArray] | list[FloatArray], device: torch.device) -> list[Tensor]:
    """The arrays (of one dtype) as tensors on ``device``, through one concatenation and one copy."""
    return host_to_device_parts(np.concatenate(parts), [len(part) for part in parts], device)
