"""Verification of draft tokens against the target's logits, batched on the device: greedy acceptance and
exact rejection sampling. Nothing here reads the device back: the engine reads the verified tokens in the
step's one read-back (``verify`` is the list-returning wrapper tests and tools call)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch
from torch import Tensor

from openinfer.kernels.attention import host_to_device, host_to_device_parts
from openinfer.kernels.sampling import SamplingBatch, draw, uniforms


@dataclass(frozen=True)
class Verified:
    """Per sampling request, on the device: how many of its drafts it accepted and the tokens to append.

    Row r of ``tokens`` holds request r's accepted drafts, then one token of the target's, then padding:
    its first ``num_accepted[r] + 1`` entries are its tokens.
    """

    num_accepted: Tensor | None  # (R,) int64; None when no request had drafts (every count is 0)
    tokens: Tensor  # (R, W) int64, W = 1 + the longest draft

    def read(self, counts: list[int] | None, tokens: list[int]) -> list[list[int]]:
        """The tokens per request from the host copies of ``num_accepted`` and ``tokens`` (flat)."""
        if counts is None:  # one column
            return [[t] for t in tokens]
        width = self.tokens.shape[1]
        return [tokens[r * width : r * width + n + 1] for r, n in enumerate(counts)]


def accepted_prefix_length(drafts: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading draft tokens equal the target's tokens at their positions: greedy acceptance.

    The one longest-prefix walk on the host: the training script's simulated rounds and the tests' oracles
    count with it (``verify_on_device`` counts the same run on the device). ``targets`` may be longer than
    ``drafts`` (the bonus position) or shorter.
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
    """``verify_on_device``, read back: per request, its accepted draft tokens then one token of the target's
    (tests and tools; the engine reads the device output in its step's one read-back)."""
    if not drafts:
        return []
    verified = verify_on_device(logits, drafts, batch, starts)
    counts = verified.num_accepted.tolist() if verified.num_accepted is not None else None
    return verified.read(counts, verified.tokens.flatten().tolist())


def verify_on_device(
    logits: Tensor,
    drafts: Sequence[Sequence[int]],
    batch: SamplingBatch,
    starts: Sequence[int] | None = None,
) -> Verified:
    """Per request (R >= 1), its accepted count and tokens on the device, nothing read back.

    logits (sum(len(d) + 1 for d in drafts), V) float32: request b's len(drafts[b]) + 1 verified positions,
    back to back (``starts``: each request's first row, when the caller has them). A request without drafts
    is plain sampling (one token). Greedy requests accept the longest prefix of drafts equal to the target's
    argmax (a cumulative product over the padded rows); the others use rejection sampling
    (see ``_rejection_sample``).
    """
    device = logits.device
    argmax = logits.argmax(dim=-1)  # (N,)
    sampled = batch.sampled()
    lens = [len(d) for d in drafts]
    width = max(lens) + 1
    if width == 1 and not sampled:  # greedy, no drafts: one token per request, its row's argmax
        return Verified(None, argmax[:, None])
    if starts is None:
        starts = list(accumulate((n + 1 for n in lens[:-1]), initial=0))
    num_reqs = len(drafts)
    # Row of request r's position j; past its drafts the last row repeats (never read: past its tokens).
    rows = np.asarray(starts, dtype=np.int64)[:, None] + np.minimum(
        np.arange(width), np.asarray(lens, dtype=np.int64)[:, None]
    )  # (R, W)
    # Drafts padded to W columns with -1 (never the argmax, so never accepted): position j = #accepted indexes.
    pad = [-1] * width
    padded = np.fromiter(
        (t for d in drafts for t in (*d, *pad[: width - len(d)])), dtype=np.int64, count=num_reqs * width
    )
    rows_t, draft_ids = host_to_device_parts(np.concatenate((rows.ravel(), padded)), [rows.size] * 2, device)
    tokens = argmax[rows_t].view(num_reqs, width)  # (R, W): the target's argmax; accepted drafts equal it
    num_accepted = (draft_ids.view(num_reqs, width) == tokens).cumprod(dim=1).sum(dim=1)  # (R,)
    if sampled:
        counts, drawn = _rejection_sample(logits, drafts, starts, batch, sampled)  # (S,), (S, k + 1)
        index = host_to_device(sampled, torch.int64, device)  # (S,)
        num_accepted = num_accepted.index_copy(0, index, counts)
        padded_drawn = torch.nn.functional.pad(drawn, (0, width - drawn.shape[1]))  # (S, W)
        tokens = tokens.index_copy(0, index, padded_drawn)
    return Verified(num_accepted, tokens)


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
