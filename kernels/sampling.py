"""The sampler's distribution (temperature, min-p, top-k, top-p, in vLLM's order) and seedable draws, all
on the logits' device.

Nothing here reads a value back to the host (draws are inverse-CDF lookups on the device), so a step needs
no host sync until its sampled ids are read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from openinfer.kernels.host_copy import host_to_device


@dataclass(frozen=True)
class SamplingBatch:
    """One step's sampling parameters, one entry per sampling request, checked once (host lists).

    A temperature below 1e-5 is greedy (the caller maps it to 0). ``top_ks`` holds the vocabulary size where
    a request sets no top-k, so every row can be filtered alike.
    """

    temperatures: list[float]  # 0: greedy
    top_ks: list[int]  # in [1, V]
    top_ps: list[float]  # in (0, 1]
    generators: list[torch.Generator | None]  # per request; None: the device's default generator
    min_ps: list[float] | None = None  # in [0, 1] (0: off); None: no request sets one

    @classmethod
    def build(
        cls,
        temperatures: list[float],
        top_ks: list[int | None],
        top_ps: list[float],
        generators: list[torch.Generator | None],
        vocab_size: int,
        min_ps: list[float] | None = None,
    ) -> SamplingBatch:
        """The batch of one step (top_k None or 0: the whole vocabulary; min_ps None: no min-p). The values
        were checked when each request was admitted (``EngineCore.add_request``), not again on every step."""
        if not len(temperatures) == len(top_ks) == len(top_ps) == len(generators) == len(min_ps or top_ps):
            raise ValueError("sampling: every request needs a temperature, top_k, top_p, min_p and generator")
        ks = [min(k or vocab_size, vocab_size) for k in top_ks]
        min_ps = list(min_ps) if min_ps is not None and any(min_ps) else None
        return cls(list(temperatures), ks, list(top_ps), list(generators), min_ps)

    @classmethod
    def greedy(cls, num_reqs: int, vocab_size: int) -> SamplingBatch:
        """A batch of ``num_reqs`` greedy requests (no top-k or top-p, the default generator)."""
        return cls([0.0] * num_reqs, [vocab_size] * num_reqs, [1.0] * num_reqs, [None] * num_reqs)

    def sampled(self) -> list[int]:
        """The requests that draw (temperature > 0)."""
        return [b for b, t in enumerate(self.temperatures) if t > 0]

    def probs(self, logits: Tensor, requests: list[int], repeats: int) -> Tensor:
        """``processed_probs`` of ``logits`` (len(requests) * repeats, V), ``repeats`` rows per request."""
        device, vocab_size = logits.device, logits.shape[1]
        temperatures = [self.temperatures[b] for b in requests for _ in range(repeats)]
        top_ks = [self.top_ks[b] for b in requests for _ in range(repeats)]
        top_ps = [self.top_ps[b] for b in requests for _ in range(repeats)]
        filtered = any(k < vocab_size for k in top_ks) or any(p < 1 for p in top_ps)
        min_ps = None
        if self.min_ps is not None:
            min_ps = host_to_device(
                [self.min_ps[b] for b in requests for _ in range(repeats)], torch.float32, device
            )
        return processed_probs(
            logits,
            host_to_device(temperatures, torch.float32, device),
            host_to_device(top_ks, torch.int64, device),
            host_to_device(top_ps, torch.float32, device),
            filtered,
            min_ps,
        )


def sorted_filtered_probs(
    logits: Tensor, temperatures: Tensor, top_ks: Tensor, top_ps: Tensor, min_ps: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The sampler's distribution per row, most likely token first (sampling and verification share it).

    logits (R, V) float32, temperatures (R,) > 0, top_ks (R,) in [1, V], top_ps (R,) in (0, 1], min_ps (R,)
    in [0, 1] or None -> probs (R, V) sorted descending and order (R, V), the vocabulary id of each sorted
    column: softmax(logits / temperature) without the tokens below min_p times the top probability,
    restricted to the top_k most likely tokens, then to the nucleus (the smallest set of the most likely
    tokens whose mass reaches top_p; at least one token). Not renormalised after the nucleus cut.
    """
    rank = torch.arange(logits.shape[1], device=logits.device)  # (V,)
    scaled, order = torch.sort(logits / temperatures[:, None], dim=-1, descending=True)  # (R, V), best first
    cut = rank[None, :] >= top_ks[:, None]  # (R, V): past the top-k
    if min_ps is not None:
        cut |= min_p_cut(scaled, min_ps)
    probs = scaled.masked_fill(cut, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # (R, V): mass of the strictly more likely tokens
    # Keep a token while the mass before it is short of top_p; the first token is always kept.
    return probs.masked_fill((mass_before >= top_ps[:, None]) & (rank[None, :] > 0), 0.0), order


def processed_probs(
    logits: Tensor,
    temperatures: Tensor,
    top_ks: Tensor,
    top_ps: Tensor,
    filtered: bool,
    min_ps: Tensor | None = None,
) -> Tensor:
    """The distribution the sampler draws from, renormalised, in vocabulary order: (R, V) float32.

    ``filtered`` False (no row restricts top-k or top-p) skips the sort: a tempered softmax, cut by min-p.
    """
    if not filtered:
        scaled = logits / temperatures[:, None]
        if min_ps is not None:
            scaled = scaled.masked_fill(min_p_cut(scaled, min_ps), float("-inf"))
        return scaled.softmax(dim=-1)
    probs, order = sorted_filtered_probs(logits, temperatures, top_ks, top_ps, min_ps)  # (R, V) each
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.empty_like(probs).scatter_(-1, order, probs)  # back to vocabulary order


def min_p_cut(scaled: Tensor, min_ps: Tensor) -> Tensor:
    """(R, V) bool: the tokens min-p drops from tempered logits ``scaled`` (R, V), those whose probability is
    below min_ps (R,) times the row's top probability (vLLM's and transformers' rule; 0 drops nothing)."""
    probs = scaled.softmax(dim=-1)
    return probs < min_ps[:, None] * probs.amax(dim=-1, keepdim=True)


def draw(probs: Tensor, generators: list[torch.Generator | None]) -> Tensor:
    """One token per row of ``probs`` (R, V), unnormalised, row r drawn with generators[r]: (R,) int64
    (``draw_at`` one uniform from each row's generator)."""
    return draw_at(probs, uniforms([1] * probs.shape[0], 1, generators, probs.device)[:, 0])


def draw_at(probs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF sampling: the first token of each row of ``probs`` (R, V), unnormalised, whose cumulative
    mass exceeds u[r] (R,) in [0, 1) times the row's total: (R,) int64, on the device without a read-back or
    a host sync (CUDA graphs capture it; tokens of probability 0 are never drawn)."""
    cdf = probs.cumsum(dim=-1)  # (R, V)
    tokens = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).squeeze(1)  # (R,)
    # u * total rounding up to the total would point past the last token of non-zero probability.
    vocab = torch.arange(probs.shape[1], device=probs.device)
    last = torch.where(probs > 0, vocab, 0).amax(dim=-1)  # (R,)
    return torch.minimum(tokens, last)


def uniforms(
    widths: list[int], width: int, generators: list[torch.Generator | None], device: torch.device
) -> Tensor:
    """(R, width) float32: row r holds widths[r] <= width uniforms in [0, 1) from generators[r], then 1.0.

    A row drawn with a generator of its own takes exactly widths[r] numbers, so a seeded request draws the
    same whatever else is in its batch.
    """
    out = torch.ones(len(widths), width, dtype=torch.float32, device=device)
    for members, generator in _groups(generators):
        used = max(widths[r] for r in members)
        if used:
            rows = torch.empty(len(members), used, dtype=torch.float32, device=device).uniform_(
                generator=generator
            )
            out[host_to_device(members, torch.int64, device), :used] = rows
    return out


def _groups(generators: list[torch.Generator | None]) -> list[tuple[list[int], torch.Generator | None]]:
    """The rows of each distinct generator (None, the default one, is one generator), in first-use order."""
    groups: dict[int, list[int]] = {}
    for r, generator in enumerate(generators):
        groups.setdefault(id(generator), []).append(r)
    return [(members, generators[members[0]]) for members in groups.values()]
