"""Verification of draft tokens against the target's logits: greedy and exact rejection sampling."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from openinfer.kernels.sampling import sample, sorted_filtered_probs


def processed_probs(logits: Tensor, temperature: float, top_k: int | None, top_p: float) -> Tensor:
    """The distribution the sampler draws from, in vocabulary order.

    logits (N, V) float32 -> probs (N, V): `sorted_filtered_probs` (temperature, top_k, nucleus; ``temperature``
    must be > 0), renormalised and put back in vocabulary order.
    """
    n = logits.shape[0]
    temperatures = torch.full((n,), temperature, dtype=torch.float32, device=logits.device)
    top_ps = torch.full((n,), top_p, dtype=torch.float32, device=logits.device)
    probs, order = sorted_filtered_probs(logits, temperatures, [top_k] * n, top_ps)  # (N, V) each
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.empty_like(probs).scatter_(-1, order, probs)  # back to vocabulary order


def accepted_prefix_length(drafts: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading draft tokens equal the target's tokens at their positions: greedy acceptance.

    The one longest-prefix walk: verification, the training script's simulated rounds and the tests' oracles
    all count with it. ``targets`` may be longer than ``drafts`` (the bonus position) or shorter.
    """
    accepted = 0
    while accepted < min(len(drafts), len(targets)) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return accepted


def verify_greedy(argmax: list[int], drafts: list[int]) -> list[int]:
    """Tokens to append: the longest prefix of ``drafts`` equal to the target's argmax, plus one target token.

    ``argmax`` holds the target's argmax at the len(drafts) + 1 verified positions.
    """
    accepted = accepted_prefix_length(drafts, argmax)
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
