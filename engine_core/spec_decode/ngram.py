"""n-gram prompt lookup: propose the tokens that followed the latest n-gram's earlier occurrence."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from openinfer.engine_core.spec_decode.drafter import ContextRows, DraftQuery


def ngram_propose(token_ids: Sequence[int], min_n: int, max_n: int, max_drafts: int) -> list[int]:
    """vLLM's prompt lookup over prompt + output.

    The longest suffix n-gram, n in [min_n, max_n], that occurred earlier; among equally long matches the
    earliest occurrence; up to ``max_drafts`` tokens that follow it (fewer when the sequence ends first);
    [] when nothing matches.
    """
    if max_drafts < 1:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        # Windows over tokens[:-1] start at 0 .. len-1-n: every earlier n-gram, never the suffix itself.
        windows = sliding_window_view(tokens[:-1], n)  # (len - n, n)
        starts = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if starts.size:
            follow = int(starts[0]) + n
            return list(token_ids[follow : follow + max_drafts])
    return []


class NgramDrafter:
    """Prompt-lookup drafter: no model, no context; proposes from each request's own tokens."""

    aux_layer_ids: tuple[int, ...] = ()
    estimates_confidence = False

    def __init__(self, num_spec_tokens: int, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4) -> None:
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(
                "need 1 <= --prompt-lookup-min <= --prompt-lookup-max, "
                f"got {prompt_lookup_min} and {prompt_lookup_max}"
            )
        self.num_spec_tokens = num_spec_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def describe(self) -> str:
        return f"ngram K={self.num_spec_tokens} n=[{self.min_n}, {self.max_n}]"

    def extend_context(self, rows: ContextRows) -> None:
        pass  # it reads only token ids

    def propose(self, queries: list[DraftQuery]) -> list[list[int]]:
        return [
            ngram_propose(q.token_ids, self.min_n, self.max_n, min(q.max_drafts, self.num_spec_tokens))
            for q in queries
        ]
