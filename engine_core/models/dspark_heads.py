"""DSpark's two heads on top of a DFlash block (DeepSeek's DeepSpec, `Qwen3DSparkModel`).

Learned from DeepSpec (`deepspec/modeling/dspark/markov_head.py`, `common.py`) and cross-checked with PyPI
`speculators` (`models/dspark/model_definitions.py`, the test's oracle). Parameter names equal the checkpoint's
under the `markov_head.` and `confidence_head.` prefixes.

- The Markov head makes drafting semi-autoregressive inside a block: slot k's logits get a bias from the token
  before it, prev_k (the current token for slot 0, the token drafted at slot k - 1 after that), through a
  rank-r factorisation e_k = markov_w1[prev_k] (r,), bias_k = markov_w2(f(e_k)) (vocab,), added to the raw
  logits before any softmax. f is the identity (`vanilla`), a gate sigmoid(gate_proj([h_k; e_k])) * e_k
  (`gated`), or tanh of the output part of a small recurrent cell over [state; e_k; h_k] whose state starts at
  zero in every block (`rnn`; slot k's bias reads the state before slot k updates it).
- The confidence head estimates P(draft k accepted | drafts before it accepted): sigmoid(proj([h_k; e_k]))
  (or of h_k alone when the checkpoint's `confidence_head_with_markov` is false).
- openinfer's own addition, invisible to DeepSpec's loader: a second confidence head of the same shape, fitted
  to the acceptance of drafts drawn at a temperature T > 0 (rejection sampling's 1 - TV at T), in the folder's
  `sampled_confidence.safetensors` under `sampled_confidence_head.`, named by the config's
  `sampled_confidence_temperature` (T); the engine reads it for requests sampled at T > 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import Tensor, nn

SAMPLED_CONFIDENCE_FILE = "sampled_confidence.safetensors"  # the second head's tensors, beside the checkpoint


class MarkovHeadType(enum.StrEnum):
    """`markov_head_type` in a DSpark config."""

    VANILLA = "vanilla"
    GATED = "gated"
    RNN = "rnn"


@dataclass(frozen=True)
class DSparkHeadsConfig:
    """The heads a DSpark checkpoint carries (its config.json's DeepSpec fields)."""

    markov_rank: int  # r; 0 = no Markov head (DeepSpec's DFlash drafters)
    markov_head_type: MarkovHeadType
    confidence_head: bool  # `enable_confidence_head`
    confidence_with_markov: bool  # `confidence_head_with_markov`: the head reads [h_k; e_k], else h_k
    # `sampled_confidence_temperature`: the T a second head (SAMPLED_CONFIDENCE_FILE) was fitted at; None: none
    sampled_confidence_temperature: float | None = None

    def __post_init__(self) -> None:
        if self.markov_rank < 0:
            raise ValueError(f"markov_rank must be >= 0, got {self.markov_rank}")
        sampled = self.sampled_confidence_temperature
        if sampled is not None and not (self.confidence_head and 0 < sampled < float("inf")):
            raise ValueError(
                f"sampled_confidence_temperature {sampled} needs a confidence head "
                "(enable_confidence_head) and a temperature > 0"
            )
        if self.confidence_head and self.confidence_with_markov and self.markov_rank == 0:
            raise ValueError("confidence_head_with_markov needs a Markov head (markov_rank > 0)")


class MarkovHead(nn.Module):
    """The low-rank bias of a slot's logits from the token before it, one slot at a time (`step`)."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, head_type: MarkovHeadType) -> None:
        super().__init__()
        self.head_type, self.rank = head_type, rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        if head_type is MarkovHeadType.GATED:
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif head_type is MarkovHeadType.RNN:
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)  # -> [gate; candidate; output]

    def initial_state(self, batch: int, like: Tensor) -> Tensor | None:
        """(batch, r) zeros for the `rnn` head at a block's first slot; None for the stateless heads."""
        if self.head_type is not MarkovHeadType.RNN:
            return None
        return like.new_zeros(batch, self.rank)

    def embed(self, prev_ids: Tensor) -> Tensor:
        """(B,) int64 previous tokens -> (B, r) e = markov_w1[prev]."""
        return self.markov_w1(prev_ids)

    def step(self, prev_embed: Tensor, hidden: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """One slot: prev_embed (B, r), the slot's final hidden (B, hidden) and the state before it -> the
        bias (B, vocab) in the head's dtype and the state after it."""
        if self.head_type is MarkovHeadType.VANILLA:
            return self.markov_w2(prev_embed), state
        if self.head_type is MarkovHeadType.GATED:
            gate = torch.sigmoid(self.gate_proj(torch.cat((hidden, prev_embed), dim=-1)))  # (B, r)
            return self.markov_w2(gate * prev_embed), state
        assert state is not None, "the rnn head steps from initial_state()"
        gate_raw, candidate_raw, output_raw = self.joint_proj(
            torch.cat((state, prev_embed, hidden), dim=-1)
        ).chunk(3, dim=-1)  # (B, r) each
        gate = torch.sigmoid(gate_raw)
        new_state = gate * state + (1.0 - gate) * torch.tanh(candidate_raw)
        return self.markov_w2(torch.tanh(output_raw)), new_state


class ConfidenceHead(nn.Module):
    """sigmoid(proj(features)): the estimated conditional acceptance of one draft slot."""

    def __init__(self, hidden_size: int, markov_rank: int, with_markov: bool) -> None:
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(hidden_size + (markov_rank if with_markov else 0), 1)

    def forward(self, hidden: Tensor, prev_embed: Tensor | None) -> Tensor:
        """hidden (B, hidden) and, with the Markov features, prev_embed (B, r) -> (B,) float32 in (0, 1)."""
        return torch.sigmoid(self.logit(hidden, prev_embed).float())

    def logit(self, hidden: Tensor, prev_embed: Tensor | None) -> Tensor:
        """The confidence before its sigmoid, (B,) in the head's dtype (what training's BCE reads)."""
        return self.proj(self.features(hidden, prev_embed)).squeeze(-1)

    def features(self, hidden: Tensor, prev_embed: Tensor | None) -> Tensor:
        """What the head reads: hidden (B, hidden), with the Markov embedding (B, r) after it when it reads
        one -> (B, in_features)."""
        if not self.with_markov:
            return hidden
        assert prev_embed is not None, "this confidence head reads the Markov embedding"
        return torch.cat((hidden, prev_embed), dim=-1)
