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

from openinfer.kernels.host_copy import host_to_device
from openinfer.kernels.sampling import SamplingBatch, draw, uniforms


@dataclass(frozen=True)
class Verified:
    """Per sampling request, on the device: the tokens to append and, once known, how many drafts it accepted.

    Row r of ``tokens`` holds request r's accepted drafts, then one token of the target's, then padding:
    its first ``accepted + 1`` entries are its tokens. When every request is greedy the row is the target's
    argmax at each of its positions and ``num_accepted`` is None: the accepted drafts are the argmax there,
    and the count is the longest prefix of ``drafts`` equal to the row, on the host once the row is read
    back (``read``) or on the device for whoever needs it before (``accepted``).
    """

    num_accepted: Tensor | None  # (R,) int64, or None: greedy, counted from the rows and the drafts
    tokens: Tensor  # (R, W) int64, W = 1 + the longest draft
    drafts: Sequence[Sequence[int]]  # per request, the drafts it verified (host)

    def read(self, counts: list[int] | None, tokens: list[int]) -> list[list[int]]:
        """The tokens per request, from the host copies of ``tokens`` (flat) and of ``num_accepted`` (None
        when it is None)."""
        width = self.tokens.shape[1]
        if width == 1:  # no drafts
            return [[t] for t in tokens]
        rows = [tokens[r * width : (r + 1) * width] for r in range(len(self.drafts))]
        if counts is None:
            counts = [accepted_prefix_length(d, row) for d, row in zip(self.drafts, rows, strict=True)]
        return [row[: n + 1] for row, n in zip(rows, counts, strict=True)]

    def accepted(self) -> Tensor:
        """(R,) int64 accepted counts on the device (computed from the greedy rows when not yet known: the
        longest prefix of drafts equal to the argmax, a cumulative product over the padded rows)."""
        if self.num_accepted is not None:
            return self.num_accepted
        num_reqs, width = self.tokens.shape
        # Drafts padded with -1 (never an argmax, so never accepted): position j = #accepted indexes.
        pad = [-1] * width
        padded = [t for d in self.drafts for t in (*d, *pad[: width - len(d)])]
        draft_ids = host_to_device(padded, torch.int64, self.tokens.device).view(num_reqs, width)
        return (draft_ids == self.tokens).cumprod(dim=1).sum(dim=1)


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
    draft_probs: Sequence[Tensor | None] | None = None,
) -> list[list[int]]:
    """``verify_on_device``, read back: per request, its accepted draft tokens then one token of the target's
    (tests and tools; the engine reads the device output in its step's one read-back)."""
    if not drafts:
        return []
    verified = verify_on_device(logits, drafts, batch, starts, draft_probs)
    counts = verified.num_accepted.tolist() if verified.num_accepted is not None else None
    return verified.read(counts, verified.tokens.flatten().tolist())


def verify_on_device(
    logits: Tensor,
    drafts: Sequence[Sequence[int]],
    batch: SamplingBatch,
    starts: Sequence[int] | None = None,
    draft_probs: Sequence[Tensor | None] | None = None,
) -> Verified:
    """Per request (R >= 1), its accepted count and tokens on the device, nothing read back.

    logits (sum(len(d) + 1 for d in drafts), V) float32: request b's len(drafts[b]) + 1 verified positions,
    back to back (``starts``: each request's first row, when the caller has them). A request without drafts
    is plain sampling (one token). Greedy requests accept the longest prefix of drafts equal to the target's
    argmax (counted from the argmax rows, see ``Verified``); the others use rejection sampling
    (see ``_rejection_sample``) against ``draft_probs[b]`` (>= len(drafts[b]), V), the distribution q each
    draft was drawn from, or a one-hot q where it is None (greedy drafts).
    """
    device = logits.device
    argmax = logits.argmax(dim=-1)  # (N,)
    sampled = batch.sampled()
    lens = [len(d) for d in drafts]
    width = max(lens) + 1
    num_reqs = len(drafts)
    if argmax.shape[0] == num_reqs * width:  # every request has width - 1 drafts: its rows are back to back
        tokens = argmax.view(num_reqs, width)  # (R, W): the target's argmax at each request's positions
    else:
        if starts is None:
            starts = list(accumulate((n + 1 for n in lens[:-1]), initial=0))
        # Row of request r's position j; past its drafts the last row repeats (never read: past its tokens).
        rows = np.asarray(starts, dtype=np.int64)[:, None] + np.minimum(
            np.arange(width), np.asarray(lens, dtype=np.int64)[:, None]
        )  # (R, W)
        tokens = argmax[host_to_device(rows.ravel(), torch.int64, device)].view(num_reqs, width)
    verified = Verified(None, tokens, drafts)
    if not sampled:
        return verified
    if starts is None:
        starts = list(accumulate((n + 1 for n in lens[:-1]), initial=0))
    probs = draft_probs if draft_probs is not None else [None] * num_reqs
    counts, drawn = _rejection_sample(logits, drafts, starts, batch, sampled, probs)  # (S,), (S, k + 1)
    index = host_to_device(sampled, torch.int64, device)  # (S,)
    num_accepted = (
        verified.accepted() if width > 1 else torch.zeros(num_reqs, dtype=torch.int64, device=device)
    )
    padded_drawn = torch.nn.functional.pad(drawn, (0, width - drawn.shape[1]))  # (S, W)
    return Verified(
        num_accepted.index_copy(0, index, counts), tokens.index_copy(0, index, padded_drawn), drafts
    )


def _rejection_sample(
    logits: Tensor,
    all_drafts: Sequence[Sequence[int]],
    all_starts: Sequence[int],
    batch: SamplingBatch,
    requests: list[int],
    all_probs: Sequence[Tensor | None],
) -> tuple[Tensor, Tensor]:
    """Rejection sampling of ``requests`` (R of the batch), batched: (R,) accepted counts, (R, K + 1) tokens.

    Draft token d_i, drawn from q_i (``all_probs``; a one-hot q for greedy drafts), is accepted with
    probability min(1, p_i(d_i) / q_i(d_i)); on the first rejection the correction is drawn from the residual
    max(0, p_i - q_i), renormalised (with a one-hot q: p_i without d_i); when every draft token is accepted a
    bonus token is drawn from the last row. Every output position is then distributed exactly as p_i
    (Leviathan et al., 2023). Row i of the tokens holds the accepted drafts, then the drawn token, then
    padding.
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
    q = _draft_distributions(draft_ids, num_drafts, [all_probs[b] for b in requests], vocab)  # (R, K+1, V)
    own = probs.gather(2, draft_ids[:, :, None]).squeeze(2)  # (R, K + 1): p_j(d_j)
    own_q = q.gather(2, draft_ids[:, :, None]).squeeze(2)  # (R, K + 1): q_j(d_j), 1 for a greedy draft
    # u < p / q, written without dividing (q(d) > 0 for every drawn draft).
    accepted = (uniforms(lens, width, generators, device) * own_q < own) & (
        pos[None, :] < num_drafts[:, None]
    )
    num_accepted = accepted.cumprod(dim=1).sum(dim=1)  # (R,) the accepted run's length
    at = torch.arange(num_reqs, device=device)
    last = probs[at, num_accepted]  # (R, V): p at the first unaccepted position
    residual = torch.clamp(last - q[at, num_accepted], min=0.0)  # max(0, p - q) there
    # p and q equal to float precision leave no residual: rejection had no probability; draw from p.
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, last)
    residual = torch.where((num_accepted < num_drafts)[:, None], residual, last)  # the bonus row as it is
    final = draw(residual, generators)  # (R,); draw renormalises
    return num_accepted, torch.where(pos[None, :] < num_accepted[:, None], draft_ids, final[:, None])


def _draft_distributions(
    draft_ids: Tensor, num_drafts: Tensor, probs: Sequence[Tensor | None], vocab: int
) -> Tensor:
    """(R, K + 1, V): row r's q at each draft position, its drafter's ``probs`` where it sampled them, else
    the one-hot of the draft; zeros past its drafts (the bonus column included)."""
    width = draft_ids.shape[1]
    within = torch.arange(width, device=draft_ids.device)[None, :] < num_drafts[:, None]  # (R, K + 1)
    q = torch.nn.functional.one_hot(draft_ids, vocab).to(torch.float32) * within[:, :, None]
    for r, rows in enumerate(probs):
        if rows is not None:
            n = min(rows.shape[0], width - 1)
            q[r, :n] = torch.where(within[r, :n, None], rows[:n].to(torch.float32), 0.0)
    return q


def sample(logits: Tensor, batch: SamplingBatch) -> list[int]:
    """One token per row of ``logits`` (B, V) float32: ``verify`` without drafts (argmax when greedy, else a
    draw from the processed distribution)."""
    return [tokens[0] for tokens in verify(logits, [[] for _ in range(logits.shape[0])], batch)]
