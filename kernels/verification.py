"""Verification of draft tokens against the target's logits, batched on the device: greedy acceptance and
exact rejection sampling, one host sync per call (the sampled ids)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch
from torch import Tensor

from openinfer.kernels.attention import host_to_device
from openinfer.kernels.sampling import SamplingBatch, draw, uniforms


def accepted_prefix_length(drafts: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading draft tokens equal the target's tokens at their positions: greedy acceptance.

    The one longest-prefix walk on the host: the training script's simulated rounds and the tests' oracles
    count with it (``verify`` counts the same run on the device). ``targets`` may be longer than ``drafts``
    (the bonus position) or shorter.
    """
    accepted = 0
    while accepted < min(len(drafts), len(targets)) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return accepted


def verify(
    logits: Tensor,
    drafts: Sequence[Sequence[int]],
    batch: SamplingBatch,
    starts: Sequence[int] | None = None,
) -> list[list[int]]:
    """Per request, the tokens to append: its accepted draft tokens, then one token from the target.

    logits (sum(len(d) + 1 for d in drafts), V) float32: request b's len(drafts[b]) + 1 verified positions,
    back to back (``starts``: each request's first row, when the caller has them). A request without drafts
    is plain sampling (its list is one token long). Greedy requests
    accept the longest prefix of drafts equal to the target's argmax (walked on the host over the argmax).
    The others use rejection sampling on the device (see ``_rejection_sample``). One host sync in all.
    """
    if not drafts:
        return []
    argmax = logits.argmax(dim=-1)  # (N,)
    sampled = batch.sampled()
    if not sampled and logits.shape[0] == len(drafts):  # greedy, no drafts: one token per request
        return [[t] for t in argmax.tolist()]
    if starts is None:
        starts = list(accumulate((len(d) + 1 for d in drafts[:-1]), initial=0))
    width = 0  # columns of the sampled requests' token rows
    read_back = argmax
    if sampled:
        counts, tokens = _rejection_sample(logits, drafts, starts, batch, sampled)
        read_back, width = torch.cat((argmax, counts, tokens.flatten())), tokens.shape[1]
    values = read_back.tolist()  # the one host sync
    num_rows, num_sampled = logits.shape[0], len(sampled)
    targets, num_accepted = values[:num_rows], values[num_rows : num_rows + num_sampled]
    drawn = values[num_rows + num_sampled :]
    out = [_greedy(d, targets[start : start + len(d) + 1]) for d, start in zip(drafts, starts, strict=True)]
    for i, b in enumerate(sampled):
        out[b] = drawn[i * width : i * width + num_accepted[i] + 1]
    return out


def _greedy(drafts: Sequence[int], targets: list[int]) -> list[int]:
    """The longest prefix of ``drafts`` equal to the target's argmax, plus the target's next token."""
    if not drafts:
        return targets[:1]
    accepted = accepted_prefix_length(drafts, targets)
    return [*drafts[:accepted], targets[accepted]]


def _rejection_sample(
    logits: Tensor,
    all_drafts: Sequence[Sequence[int]],
    all_starts: Sequence[int],
    batch: SamplingBatch,
    requests: list[int],
) -> tuple[Tensor, Tensor]:
    """Rejection sampling of ``requests`` (R of the batch), batched: (R,) accepted counts, (R, K + 1) tokens.

    Draft token d_i is accepted with probability p_i(d_i); on the first rejection the correction is drawn
    from the residual max(0, p_i - q_i), i.e. p_i without d_i, renormalised; when every draft token is
    accepted a bonus token is drawn from the last row. Every output position is then distributed exactly as
    p_i (Leviathan et al., 2023, with a one-hot q). Row i of the tokens holds the accepted drafts, then the
    drawn token, then padding.
    """
    device = logits.device
    drafts, starts = [all_drafts[b] for b in requests], [all_starts[b] for b in requests]
    generators = [batch.generators[b] for b in requests]
    num_reqs, vocab = len(requests), logits.shape[1]
    lens = [len(d) for d in drafts]
    k = max(lens)
    if k == 0:  # plain sampling: one draw from each request's distribution
        probs = batch.probs(logits[host_to_device(starts, torch.int64, device)], requests, 1)
        return torch.zeros(num_reqs, dtype=torch.int64, device=device), draw(probs, generators)[:, None]
    width = k + 1
    pos = torch.arange(width, device=device)  # (K + 1,)
    num_drafts = host_to_device(lens, torch.int64, device)  # (R,)
    # Row of request r's position j; past its drafts the last row repeats (those positions are never used).
    rows = host_to_device(starts, torch.int64, device)[:, None] + torch.minimum(
        pos[None, :], num_drafts[:, None]
    )
    # Drafts padded to K + 1 columns (the extra one is never accepted), so position j = #accepted indexes.
    padded = host_to_device([t for d in drafts for t in (*d, *[0] * (width - len(d)))], torch.int64, device)
    draft_ids = padded.view(num_reqs, width)  # (R, K + 1)
    probs = batch.probs(logits[rows.flatten()], requests, width).view(num_reqs, width, vocab)  # (R, K + 1, V)
    own = probs.gather(2, draft_ids[:, :, None]).squeeze(2)  # (R, K + 1): p_j(d_j)
    accepted = (uniforms(lens, width, generators, device) < own) & (pos[None, :] < num_drafts[:, None])
    num_accepted = accepted.cumprod(dim=1).sum(dim=1)  # (R,) the accepted run's length
    last = probs[
        torch.arange(num_reqs, device=device), num_accepted
    ]  # (R, V): p at the first unaccepted position
    rejected = draft_ids.gather(1, num_accepted[:, None])  # (R, 1): the draft token there (padding if none)
    residual = torch.where(
        (num_accepted < num_drafts)[:, None], last.scatter(1, rejected, 0.0), last
    )  # (R, V): p without the rejected token, or the bonus row as it is
    final = draw(residual, generators)  # (R,); draw renormalises
    return num_accepted, torch.where(pos[None, :] < num_accepted[:, None], draft_ids, final[:, None])


def sample(logits: Tensor, batch: SamplingBatch) -> list[int]:
    """One token per row of ``logits`` (B, V) float32: ``verify`` without drafts (argmax when greedy, else a
    draw from the processed distribution)."""
    return [tokens[0] for tokens in verify(logits, [[] for _ in range(logits.shape[0])], batch)]
