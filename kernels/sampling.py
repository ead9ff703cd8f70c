"""Next-token sampling: greedy, temperature, top-k and nucleus (top-p), exact and seedable per request."""

from __future__ import annotations

import torch
from torch import Tensor


def sample(
    logits: Tensor,
    temperatures: list[float],
    top_ks: list[int | None],
    top_ps: list[float],
    generators: list[torch.Generator | None],
) -> list[int]:
    """One token per row of `logits` (B, V) float32.

    Row b: temperature 0 takes the argmax; otherwise the token is drawn from softmax(logits / temperature)
    restricted to the top_k most likely tokens (None or 0: all), then to the nucleus, the smallest set of the
    most likely tokens whose mass reaches top_p (1.0: all; at least one token), renormalised. Draws use
    generators[b] (a seeded torch.Generator on the logits' device), or the default generator when None.
    """
    num_rows = logits.shape[0]
    if not len(temperatures) == len(top_ks) == len(top_ps) == len(generators) == num_rows:
        raise ValueError(f"sample: {num_rows} rows of logits need as many of each sampling parameter")
    if any(t < 0 for t in temperatures) or any(not 0 < p <= 1 for p in top_ps):
        raise ValueError("sample: temperatures must be >= 0 and top_ps in (0, 1]")
    if any(k is not None and k < 0 for k in top_ks):
        raise ValueError("sample: top_ks must be None or >= 0")

    tokens = logits.argmax(dim=-1).tolist()
    rows = [b for b, t in enumerate(temperatures) if t > 0]
    if not rows:
        return tokens  # all greedy: the argmax is the answer

    device = logits.device
    probs, order = sorted_filtered_probs(
        logits[rows],
        torch.tensor([temperatures[b] for b in rows], dtype=torch.float32, device=device),
        [top_ks[b] for b in rows],
        torch.tensor([top_ps[b] for b in rows], dtype=torch.float32, device=device),
    )

    # Rows that share a generator (or the default one) are drawn in one call.
    groups: dict[int, list[int]] = {}
    for i, b in enumerate(rows):
        groups.setdefault(id(generators[b]), []).append(i)
    picks = torch.empty(len(rows), dtype=torch.long, device=device)  # (R,) index into each sorted row
    for members in groups.values():
        generator = generators[rows[members[0]]]
        picks[members] = torch.multinomial(probs[members], 1, generator=generator).squeeze(1)
    sampled = order.gather(1, picks[:, None]).squeeze(1).tolist()  # (R,) vocab ids
    for b, token in zip(rows, sampled, strict=True):
        tokens[b] = token
    return tokens


def sorted_filtered_probs(
    logits: Tensor, temperatures: Tensor, top_ks: list[int | None], top_ps: Tensor
) -> tuple[Tensor, Tensor]:
    """The sampler's distribution per row, most likely token first (sampling and verification share it).

    logits (R, V) float32, temperatures (R,) > 0, top_ks (None or 0: all), top_ps (R,) in (0, 1] ->
    probs (R, V) sorted descending and order (R, V), the vocabulary id of each sorted column: softmax(logits
    / temperature) restricted to the top_k most likely tokens, then to the nucleus (the smallest set of the
    most likely tokens whose mass reaches top_p; at least one token). Not renormalised after the nucleus cut:
    torch.multinomial does that.
    """
    vocab = logits.shape[1]
    rank = torch.arange(vocab, device=logits.device)  # (V,)
    probs, order = torch.sort(logits / temperatures[:, None], dim=-1, descending=True)  # (R, V), best first
    ks = torch.tensor([min(k or vocab, vocab) for k in top_ks], device=logits.device)  # top_k >= V: all
    probs = probs.masked_fill(rank[None, :] >= ks[:, None], float("-inf")).softmax(dim=-1)  # top-k
    mass_before = probs.cumsum(dim=-1) - probs  # (R, V): mass of the strictly more likely tokens
    # Keep a token while the mass before it is short of top_p; the first token is always kept.
    return probs.masked_fill((mass_before >= top_ps[:, None]) & (rank[None, :] > 0), 0.0), order
