"""Verification of draft tokens against the target's logits: greedy and exact rejection sampling."""

from __future__ import annotations

import torch
from torch import Tensor

from openinfer.kernels.sampling import sample


def processed_probs(logits: Tensor, temperature: float, top_k: int | None, top_p: float) -> Tensor:
    """The distribution the sampler draws from, in vocabulary order.

    logits (N, V) float32 -> probs (N, V): softmax(logits / temperature) restricted to the top_k most likely
    tokens (None: all), then to the nucleus (the smallest set whose mass reaches top_p; at least one token),
    renormalised. ``temperature`` must be > 0.
    """
    vocab = logits.shape[-1]
    sorted_logits, order = torch.sort(logits / temperature, dim=-1, descending=True)  # (N, V), best first
    rank = torch.arange(vocab, device=logits.device)
    probs = sorted_logits.masked_fill(rank >= min(top_k or vocab, vocab), float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # (N, V): mass of the strictly more likely tokens
    probs = probs.masked_fill((mass_before >= top_p) & (rank > 0), 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.empty_like(probs).scatter_(-1, order, probs)  # back to vocabulary order


def verify_greedy(argmax: list[int], drafts: list[int]) -> list[int]:
    """Tokens to append: the longest prefix of ``drafts`` equal to the target's argmax, plus one target token.

    ``argmax`` holds the target's argmax at the len(drafts) + 1 verified positions.
    """
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == argmax[accepted]:
        accepted += 1
    return drafts[:accepted] + [argmax[accepted]]


def verify_sampled(probs: Tensor, drafts: list[int], generator: torch.Generator | None) -> list[int]:
    """Rejection sampling that keeps the target distribution exactly, for a deterministic draft (q = 1).

    probs (len(drafts) + 1, V): the target's processed distribution at each verified position. Draft token
    d_i is accepted with probability p_i(d_i) / q_i(d_i) = p_i(d_i); on the first rejection the correction is
    drawn from the residual max(0, p_i - q_i), i.e. p_i without d_i, renormalised; when every draft token is
    accepted a bonus token is drawn from the last row. The output token at each position is then distributed
    exactly as p_i (Leviathan et al., 2023, with a one-hot q).
    """
    uniforms = torch.rand(len(drafts), generator=generator, device=probs.device).tolist() if drafts else []
    for i, token in enumerate(drafts):
        p = probs[i]
        if uniforms[i] < p[token].item():
            continue
        residual = p.clone()
        residual[token] = 0.0
        correction = int(torch.multinomial(residual, 1, generator=generator))  # multinomial renormalises
        return drafts[:i] + [correction]
    bonus = int(torch.multinomial(probs[len(drafts)], 1, generator=generator))
    return drafts + [bonus]


def verify(
    logits: Tensor,
    drafts: list[list[int]],
    temperatures: list[float],
    top_ks: list[int | None],
    top_ps: list[float],
    generators: list[torch.Generator | None],
) -> list[list[int]]:
    """Per request, the tokens to append: its accepted draft tokens, then one token from the target.

    logits (sum(len(d) + 1 for d in drafts), V) float32: request i's len(drafts[i]) + 1 verified positions,
    back to back. A request without drafts is plain sampling (its list is one token long). Temperature 0 is
    greedy verification; otherwise rejection sampling under the request's temperature, top_k and top_p.
    """
    starts = [0]
    for d in drafts:
        starts.append(starts[-1] + len(d) + 1)
    argmax = logits.argmax(dim=-1).tolist()
    out: list[list[int]] = [[] for _ in drafts]
    plain = [i for i, d in enumerate(drafts) if temperatures[i] > 0 and not d]
    if plain:  # sampling without drafts: one batched draw
        tokens = sample(
            logits[[starts[i] for i in plain]],
            [temperatures[i] for i in plain],
            [top_ks[i] for i in plain],
            [top_ps[i] for i in plain],
            [generators[i] for i in plain],
        )
        for i, token in zip(plain, tokens, strict=True):
            out[i] = [token]
    for i, d in enumerate(drafts):
        rows = slice(starts[i], starts[i + 1])
        if temperatures[i] == 0:
            out[i] = verify_greedy(argmax[rows], d)
        elif d:
            probs = processed_probs(logits[rows], temperatures[i], top_ks[i], top_ps[i])
            out[i] = verify_sampled(probs, d, generators[i])
    return out
