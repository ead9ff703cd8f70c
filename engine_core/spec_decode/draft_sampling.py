"""How a block drafter turns its slots' logits into drafts: greedily, or drawn at each request's temperature
with the distributions they were drawn from (sampled drafting, verified against those by rejection sampling);
and DSpark's sequential stage, whose Markov head reads each slot's previous draft.

A sampled draw reads one uniform per (request, slot), drawn before the forward from the request's generator
(``draft_sampling``): the draws themselves are device ops of fixed shape with no host sync, so the draft CUDA
graphs capture them with the temperatures and uniforms as static inputs."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from openinfer.engine_core.models.dspark_heads import MarkovHead
from openinfer.engine_core.spec_decode.draft_numbers import finite_logits
from openinfer.engine_core.spec_decode.drafter import DeviceQueries
from openinfer.kernels.sampling import draw_at, uniforms


class DraftSampling(NamedTuple):
    """How a batch of blocks draws its drafts at temperature > 0, row by row."""

    temperatures: Tensor  # (B,) float32; 0 drafts greedily
    uniforms: Tensor  # (B, n) float32 in [0, 1): row b's draw at slot k reads uniforms[b, k]


def draft_sampling(
    queries: DeviceQueries, generator: torch.Generator, num_drafts: int
) -> DraftSampling | None:
    """How the queries' blocks of ``num_drafts`` slots draw (None when every request is greedy): each row's
    uniforms drawn from the request's own generator when seeded (it drafts alike whatever shares its
    batch), else from ``generator`` (the drafter's)."""
    if queries.temperatures is None:
        return None
    generators = [g or generator for g in queries.generators or [None] * len(queries.block_ids)]
    u = uniforms([num_drafts] * len(generators), num_drafts, list(generators), queries.temperatures.device)
    return DraftSampling(queries.temperatures, u)


def draw_slot(logits: Tensor, sampling: DraftSampling, k: int) -> tuple[Tensor, Tensor]:
    """Draft slot ``k`` at each request's temperature: logits (B, vocab) float32 -> the drafts (B,) and the
    distributions q they were drawn from (B, vocab): for T > 0 a draw from softmax(logits / T) at the row's
    uniform for slot k, for T = 0 the argmax and its one-hot. The draws read the logits made finite
    (``finite_logits``), so q is a distribution whatever the drafter's numbers; the argmax, a valid id
    whatever they hold, reads them as they are, as in an all-greedy batch."""
    greedy = sampling.temperatures <= 0
    scaled = finite_logits(logits) / torch.where(greedy, 1.0, sampling.temperatures)[:, None]
    probs = torch.softmax(scaled, dim=-1)
    drawn = draw_at(probs, sampling.uniforms[:, k])
    argmax = logits.argmax(dim=-1)
    one_hot = torch.zeros_like(probs).scatter_(1, argmax[:, None], 1.0)  # F.one_hot checks on the host
    return torch.where(greedy, argmax, drawn), torch.where(greedy[:, None], one_hot, probs)


def draw_slots(logits: Tensor, sampling: DraftSampling) -> tuple[Tensor, Tensor]:
    """Every slot drawn on its own (no Markov head): logits (B, n, vocab) -> drafts (B, n) and their
    distributions (B, n, vocab)."""
    slots = [draw_slot(logits[:, k], sampling, k) for k in range(logits.shape[1])]
    return torch.stack([ids for ids, _ in slots], dim=1), torch.stack([q for _, q in slots], dim=1)


def markov_stage(
    head: MarkovHead, logits: Tensor, hidden: Tensor, anchor: Tensor, sampling: DraftSampling | None
) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
    """DSpark's sequential stage, in place: slot k's logits (B, n, vocab) float32 gain the Markov head's bias
    from the token before it, the anchor (B,) for slot 0 and slot k - 1's draft after that: its argmax (so
    the argmax of the result is the greedy drafts), or with ``sampling`` its draw (``draw_slot``).
    hidden (B, n, hidden): the slots' final hidden states. Returns the embeddings of the tokens before the
    slots, (B, n, r), and with ``sampling`` the drafts and their distributions. A fixed loop of device ops:
    it runs inside the draft CUDA graphs too."""
    previous, state = anchor, head.initial_state(anchor.shape[0], hidden)
    embeds, drafts, probs = [], [], []
    for k in range(logits.shape[1]):
        embeds.append(head.embed(previous))  # (B, r)
        bias, state = head.step(embeds[-1], hidden[:, k], state)  # (B, vocab)
        logits[:, k] += bias.float()
        if sampling is None:
            previous = logits[:, k].argmax(dim=-1)
        else:
            previous, q = draw_slot(logits[:, k], sampling, k)
            drafts.append(previous)
            probs.append(q)
    drawn = (torch.stack(drafts, dim=1), torch.stack(probs, dim=1)) if sampling is not None else None
    return torch.stack(embeds, dim=1), drawn
