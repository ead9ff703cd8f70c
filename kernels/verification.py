"""Verification of draft tokens against the target's logits, batched on the device: greedy acceptance and
exact rejection sampling, one host sync per call (the sampled ids)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch
from torch import Tensor

from openinfer.kernels.sampling import SamplingBatch, draw, host_to_device, processed_probs, uniforms


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


def verify(logits: Tensor, drafts: list[list[int]], batch: SamplingBatch) -> list[list[int]]:
    """Per request, the tokens to append: its accepted draft tokens, then one token from the target.

    logits (sum(len(d) + 1 for d in drafts), V) float32: request b's len(drafts[b]) + 1 verified positions,
    back to back. A request without drafts is plain sampling (its list is one token long). Greedy requests
    accept the longest prefix of drafts equal to the target's argmax. The others use rejection sampling for
    a deterministic draft (q = 1): draft token d_i is accepted with probability p_i(d_i); on the first
    rejection the correction is drawn from the residual max(0, p_i - q_i), i.e. p_i without d_i, renormalised;
    when every draft token is accepted a bonus token is drawn from the last row. Every output position is
    then distributed exactly as p_i (Leviathan et al., 2023, with a one-hot q).
    """
    device = logits.device
    num_reqs = len(drafts)
    lens = [len(d) for d in drafts]
    k = max(lens, default=0)
    pos = torch.arange(k + 1, device=device)  # (K + 1,)
    num_drafts = host_to_device(lens, torch.int64, device)  # (B,)
    starts = host_to_device(list(accumulate((n + 1 for n in lens[:-1]), initial=0)), torch.int64, device)
    # Row of request b's position j; past its drafts the last row repeats (those positions are never used).
    rows = starts[:, None] + torch.minimum(pos[None, :], num_drafts[:, None])  # (B, K + 1)
    # Drafts padded to K + 1 columns (the extra one is never accepted), so position j = #accepted indexes.
    padded = host_to_device([t for d in drafts for t in d + [0] * (k + 1 - len(d))], torch.int64, device)
    draft_ids = padded.view(num_reqs, k + 1)  # (B, K + 1)
    in_draft = pos[None, :] < num_drafts[:, None]  # (B, K + 1)

    target = logits.argmax(dim=-1)[rows]  # (B, K + 1): the greedy token at every position
    accepted = draft_ids == target  # greedy acceptance; sampled requests overwrite theirs below
    sampled = [b for b, greedy in enumerate(batch.greedy) if not greedy]
    if sampled:
        index = host_to_device(sampled, torch.int64, device)  # (R,)
        width = k + 1
        probs = processed_probs(
            logits[rows[index].flatten()],  # (R * (K + 1), V)
            batch.temperatures[index].repeat_interleave(width),
            batch.top_ks[index].repeat_interleave(width),
            batch.top_ps[index].repeat_interleave(width),
            batch.filtered,
        ).view(len(sampled), width, -1)  # (R, K + 1, V)
        own = probs.gather(2, draft_ids[index][:, :, None]).squeeze(2)  # (R, K + 1): p_j(d_j)
        generators = [batch.generators[b] for b in sampled]
        accepted[index] = uniforms([lens[b] for b in sampled], width, generators, device) < own
    num_accepted = (accepted & in_draft).cumprod(dim=1).sum(dim=1)  # (B,) the accepted run's length

    final = target.gather(1, num_accepted[:, None]).squeeze(1)  # (B,) the token after the run, greedy
    if sampled:
        run = num_accepted[index]  # (R,)
        last = probs[
            torch.arange(len(sampled), device=device), run
        ]  # (R, V) p at the first unaccepted position
        rejected = draft_ids[index].gather(1, run[:, None])  # (R, 1): the draft token there (padding if none)
        residual = torch.where(
            (run < num_drafts[index])[:, None], last.scatter(1, rejected, 0.0), last
        )  # (R, V): p without the rejected token, or the bonus row as it is
        final[index] = draw(residual, generators)  # draw renormalises
    out = torch.where(pos[None, :] < num_accepted[:, None], draft_ids, final[:, None])  # (B, K + 1)

    values = torch.cat((num_accepted, out.flatten())).tolist()  # the one host sync
    counts, tokens = values[:num_reqs], values[num_reqs:]
    return [tokens[b * (k + 1) : b * (k + 1) + counts[b] + 1] for b in range(num_reqs)]


def sample(logits: Tensor, batch: SamplingBatch) -> list[int]:
    """One token per row of ``logits`` (B, V) float32: ``verify`` without drafts (argmax when greedy, else a
    draw from the processed distribution)."""
    return [tokens[0] for tokens in verify(logits, [[] for _ in range(logits.shape[0])], batch)]
