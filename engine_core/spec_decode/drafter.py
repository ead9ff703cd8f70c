"""The drafter interface (n-gram lookup, DFlash), and what a drafter may read of the target."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn

from openinfer.engine_core.worker.runner_output import DeviceDrafts
from openinfer.engine_core.worker.step_batch import Int64s

if TYPE_CHECKING:
    from openinfer.engine_core.models.config import ModelConfig
    from openinfer.engine_core.worker.step_graphs import StepGraphs
    from openinfer.kernels.attention_backend import AttentionBackend


@dataclass(frozen=True)
class ContextUpdate:
    """The target's aux hidden states at one request's newly verified positions [start_pos, start_pos + n)."""

    block_ids: list[int]  # the request's (target) block table; covers those positions
    start_pos: int  # first of the positions
    hidden: Tensor  # (n, len(aux_layer_ids) * target_hidden): forward_with_aux's aux outputs, concatenated


@dataclass(frozen=True)
class ContextRows:
    """The target's aux hidden states at n positions of any requests, with the KV-cache slot each goes to:
    what a drafter's context takes (the engine's step gives its positions and slots as the target's KV cache
    takes them; :func:`context_rows` makes them from requests' block tables)."""

    hidden: Tensor  # (n, len(aux_layer_ids) * target_hidden): forward_with_aux's aux outputs, concatenated
    positions: Int64s  # (n,): each row's position in its request
    slots: Int64s  # (n,): each row's KV-cache slot (block id * block size + offset)

    @staticmethod
    def join(parts: Sequence[ContextRows]) -> ContextRows:
        """The rows of `parts`, in order (one part as it is)."""
        if len(parts) == 1:
            return parts[0]
        return ContextRows(
            torch.cat([p.hidden for p in parts]),
            np.concatenate([p.positions for p in parts]),
            np.concatenate([p.slots for p in parts]),
        )


def context_rows(updates: Sequence[ContextUpdate], page_size: int) -> ContextRows:
    """The updates' rows, in order, with their slots in blocks of ``page_size`` positions (ValueError when a
    request's table does not cover its positions)."""
    parts = []
    for update in updates:
        n, table = update.hidden.shape[0], np.asarray(update.block_ids, dtype=np.int64)
        positions = np.arange(update.start_pos, update.start_pos + n, dtype=np.int64)
        if update.start_pos < 0 or len(table) * page_size < update.start_pos + n:
            raise ValueError(
                f"{len(table)} blocks of {page_size} cannot hold positions {update.start_pos}..{update.start_pos + n}"
            )
        slots = table[positions // page_size] * page_size + positions % page_size
        parts.append(ContextRows(update.hidden, positions, slots))
    return ContextRows.join(parts)


@dataclass(frozen=True)
class DraftQuery:
    """One request's ask for drafts after its current token."""

    current_token: int  # the last sampled, not yet verified token
    position: int  # its position (== verified tokens before it, all in the context)
    block_ids: list[int]  # the request's block table; covers positions [0, position)
    max_drafts: int  # propose at most this many (<= num_spec_tokens); 0 -> propose nothing
    token_ids: Sequence[
        int
    ] = ()  # prompt + output so far, ending with current_token (n-gram lookup reads it)


class Drafter(Protocol):
    """Proposes up to ``num_spec_tokens`` draft tokens per request, all requests in one call."""

    num_spec_tokens: int
    aux_layer_ids: tuple[int, ...]  # target layers whose hidden states it reads; () when none

    @property
    def estimates_confidence(self) -> bool:
        """Whether it rates each draft's acceptance (DSpark's confidence head): ``DeviceDrafts.confidence``."""
        ...

    def extend_context(self, rows: ContextRows) -> None:
        """Take the target's hidden states at newly verified positions (in order)."""

    def propose(self, queries: list[DraftQuery]) -> list[list[int]]:
        """Up to ``query.max_drafts`` draft tokens per query, in query order ([] for none)."""
        ...

    def describe(self) -> str:
        """One line for logs and replies, e.g. "ngram K=7 n=[1, 4]"."""
        ...


@dataclass(frozen=True)
class DeviceQueries:
    """B requests' asks for drafts, made before the step's read-back: what depends on the step's accepted
    counts is on the device (``DraftQuery``'s fields, one tensor each), the block tables are host lists."""

    current_tokens: Tensor  # (B,) int64: each request's last verified token (the target's own)
    positions: Tensor  # (B,) int64: its position (== verified tokens before it, all in the context)
    max_drafts: Tensor  # (B,) int64 in [0, num_spec_tokens]: the drafts it may verify (its block length)
    block_ids: list[list[int]]  # per request, its block table; covers positions [0, positions[b])
    # (B,) float32: each request's sampling temperature (0: greedy); None when every request is greedy.
    # A drafter that samples drafts at T > 0 returns the distributions it sampled them from.
    temperatures: Tensor | None = None
    # per request, the generator its drafts are drawn with when it samples: its own (seeded) or None (the
    # drafter's); None when every request is greedy
    generators: list[torch.Generator | None] | None = None


@runtime_checkable
class DeviceDrafter(Drafter, Protocol):
    """A drafter that proposes on the device from the step's device output, before the step's one read-back
    (DFlash); the others propose on the host after it (n-gram)."""

    def propose_on_device(self, queries: DeviceQueries) -> DeviceDrafts:
        """The queries' drafts on the device; the host keeps each row's first max_drafts once it has read
        them."""
        ...


class DraftTarget(Protocol):
    """What a drafter that shares the target's embedding and LM head reads of the target's runner: its hidden
    states come in through :class:`ContextRows`; the embedding and the head are these two calls; the rest
    is the geometry it follows (KV paging, device, attention backend, step graphs)."""

    device: torch.device
    dtype: torch.dtype
    block_size: int  # tokens per KV block: the drafter's context pages are the target's blocks
    num_kv_blocks: int
    model_config: ModelConfig
    attn_backend: AttentionBackend
    step_graphs: StepGraphs | None  # the target's padded steps (CUDA graphs): the drafter pads to its buckets

    @property
    def model(self) -> nn.Module:
        """The target model: a drafter weighs no more than its parameters (spec_decode/drafter_budget.py)."""
        ...

    def embed(self, token_ids: Tensor) -> Tensor:
        """(...,) int64 token ids -> (..., hidden) the target's input embeddings."""
        ...

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(n, hidden) final hidden states -> (n, vocab) float32 logits through the target's LM head."""
        ...
