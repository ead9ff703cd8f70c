"""Log-probabilities of sampled tokens and of the most likely alternatives, from raw logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class RowLogprobs:
    """Per selected row: the sampled token's logprob and the ``num_top`` most likely tokens with theirs."""

    sampled: list[float]  # (R,)
    top_token_ids: list[list[int]]  # (R, num_top), most likely first
    top_logprobs: list[list[float]]  # (R, num_top)


def token_logprobs(logits: Tensor, rows: list[int], token_ids: list[int], num_top: int) -> RowLogprobs:
    """log_softmax of ``logits[rows]`` (the raw distribution: no temperature, top-k or top-p, as vLLM's
    default ``logprobs_mode``), read at ``token_ids`` (one per row) and at the ``num_top`` largest entries.

    logits (N, V) float; rows and token_ids (R,) with rows in [0, N) and token ids in [0, V);
    0 <= num_top <= V.
    """
    if len(rows) != len(token_ids):
        raise ValueError(f"token_logprobs: {len(rows)} rows need as many token ids, got {len(token_ids)}")
    device = logits.device
    logprobs = torch.log_softmax(logits[torch.tensor(rows, device=device)].float(), dim=-1)  # (R, V)
    picked = torch.tensor(token_ids, dtype=torch.int64, device=device)[:, None]  # (R, 1)
    sampled = logprobs.gather(1, picked)  # (R, 1)
    if num_top == 0:
        return RowLogprobs(sampled.squeeze(1).tolist(), [[] for _ in rows], [[] for _ in rows])
    top = logprobs.topk(num_top, dim=-1)  # values, indices: (R, num_top), sorted descending
    # One read-back: float64 holds every token id and every float32 logprob exactly.
    parts = (sampled.double(), top.values.double(), top.indices.double())
    table = torch.cat(parts, dim=1).tolist()  # (R, 1 + 2 * num_top)
    return RowLogprobs(
        [row[0] for row in table],
        [[int(t) for t in row[1 + num_top :]] for row in table],
        [row[1 : 1 + num_top] for row in table],
    )
