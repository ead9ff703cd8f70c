"""The drafter interface (n-gram lookup, DFlash) and the choice between them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor


@dataclass(frozen=True)
class ContextUpdate:
    """The target's aux hidden states at one request's newly verified positions [start_pos, start_pos + n)."""

    block_ids: list[int]  # the request's (target) block table; covers those positions
    start_pos: int  # first of the positions
    hidden: Tensor  # (n, len(aux_layer_ids) * target_hidden): forward_with_aux's aux outputs, concatenated


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

    def extend_context(self, updates: list[ContextUpdate]) -> None:
        """Take the target's hidden states at newly verified positions (in order, per request)."""

    def propose(self, queries: list[DraftQuery]) -> list[list[int]]:
        """Up to ``query.max_drafts`` draft tokens per query, in query order ([] for none)."""
        ...

    def describe(self) -> str:
        """One line for logs and replies, e.g. "ngram K=7 n=[1, 4]"."""
        ...
