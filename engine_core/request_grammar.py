"""One request's place in its structured-output grammar (xgrammar's matcher): the rows of its logits the grammar
masks, and the tokens it keeps. The grammars are compiled and the masks applied in sample/structured_output.py."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr


class RequestGrammar:
    """One request's place in its grammar, and the masks of the rows it samples from.

    With ``start_after_token_id`` (a reasoning parser's ``</think>``) the output is free until that token and
    follows the grammar from the token after it on.
    """

    def __init__(self, compiled: xgr.CompiledGrammar, start_after_token_id: int | None = None) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self._start_after = start_after_token_id
        self._active = start_after_token_id is None

    def fill(self, bitmask: torch.Tensor, first_row: int, drafts: Sequence[int]) -> list[int]:
        """Fill rows first_row .. first_row + len(drafts) of ``bitmask`` (row i: what may follow the request's
        tokens and drafts[:i]) where the grammar restricts them, and return those rows; the others keep what
        they hold (all allowed, from ``xgr.allocate_token_bitmask``). The matcher ends where it began."""
        rows: list[int] = []
        active, accepted = self._active, 0
        for i in range(len(drafts) + 1):
            terminated = self._matcher.is_terminated()  # after a stop token: nothing left to constrain
            if active and not terminated:
                self._matcher.fill_next_token_bitmask(bitmask, first_row + i)
                rows.append(first_row + i)
            if i == len(drafts):
                break
            if not active:
                active = drafts[i] == self._start_after
            elif not terminated:
                if not self._matcher.accept_token(drafts[i]):
                    break  # row i refuses draft i: verification ends the run there
                accepted += 1
        if accepted:
            self._matcher.rollback(accepted)
        return rows

    def advance(self, tokens: Sequence[int]) -> bool:
        """Accept the tokens the step kept (accepted drafts, then the sampled token); False when one breaks
        the grammar (only possible where other options masked every token the grammar allowed)."""
        for token in tokens:
            if not self._active:
                self._active = token == self._start_after
            elif not self._matcher.is_terminated() and not self._matcher.accept_token(token):
                return False
        return True

    @property
    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()
