"""Log-probabilities of sampled tokens and of the most likely alternatives, from raw logits, on the device."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from openinfer.kernels.host_copy import host_to_device


@dataclass(frozen=True)
class RowLogprobs:
    """One row's sampled-token logprob and the ``num_top`` most likely tokens with theirs (host values)."""

    sampled: float
    top_token_ids: list[int]  # (num_top,), most likely first
    top_logprobs: list[float]  # (num_top,)


def logprob_table(logits: Tensor, rows: list[int], token_ids: Tensor, num_top: int) -> Tensor:
    """log_softmax of ``logits[rows]`` (the raw distribution: no temperature, top-k or top-p, as vLLM's
    default ``logprobs_mode``), read at ``token_ids`` (one per row, on the device) and at the ``num_top``
    largest entries: (R, 1 + 2 * num_top) float64 on the device, nothing read back.

    Row r holds the sampled token's logprob, the top logprobs, then the top token ids: float64 holds every
    token id and every float32 logprob exactly, so the table joins the step's one read-back as it is.
    logits (N, V) float; rows (R,) in [0, N); token_ids (R,) int64 in [0, V); 0 <= num_top <= V.
    """
    if len(rows) != token_ids.shape[0]:
        raise ValueError(f"logprob_table: {len(rows)} rows need as many token ids, got {token_ids.shape[0]}")
    logprobs = torch.log_softmax(logits[host_to_device(rows, torch.int64, logits.device)].float(), dim=-1)
    sampled = logprobs.gather(1, token_ids[:, None]).double()  # (R, 1)
    if num_top == 0:
        return sampled
    top = logprobs.topk(num_top, dim=-1)  # values, indices: (R, num_top), sorted descending
    return torch.cat((sampled, top.values.double(), top.indices.double()), dim=1)


def read_row(row: list[float], num_top: int) -> RowLogprobs:
    """One row of a :func:`logprob_table` read back (1 + 2 * num_top values)."""
    return RowLogprobs(row[0], [int(t) for t in row[1 + num_top :]], row[1 : 1 + num_top])
