"""Prompts cut from a text by token counts: windows of consecutive token ids that re-encode to themselves.

A server tokenizes the prompt *text*, so a window of ids is only as long as it says when decoding it and
encoding the text again gives the same ids back. Nearly every window of prose does; a window glued after
other ids (a prefix) fails a few times in a hundred, where the byte-level BPE merges across the joint. So a
window is drawn at seeded offsets until it round-trips after what precedes it (at most ``MAX_TRIES`` times),
and, where prompts must part at a known token, until it starts with a token its siblings do not.
"""

from __future__ import annotations

import random
from collections.abc import Sequence, Set

from tokenizers import Tokenizer

MAX_TRIES = 64  # offsets tried for a window that round-trips; past this the last one is kept as it is


class TextWindows:
    """A text's token ids under the bench's tokenizer, and seeded windows of them."""

    def __init__(self, text: str, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids = tokenizer.encode(text, add_special_tokens=False).ids

    def check_length(self, length: int) -> None:
        """``ValueError`` unless the text holds a window of ``length`` tokens (and one more to choose from)."""
        if len(self.ids) < length + 1:
            raise ValueError(f"the text has {len(self.ids)} tokens, too few for {length}-token prompts")

    def window(
        self, rng: random.Random, length: int, after: Sequence[int] = (), avoid_first: Set[int] = frozenset()
    ) -> list[int]:
        """``length`` consecutive ids of the text at the first offset drawn from ``rng`` where ``after`` + the
        window encode back to exactly those ids and the window does not start with a token in ``avoid_first``
        (the last offset tried when none of ``MAX_TRIES`` does).

        The first draw is ``rng.randrange(len(ids) - length + 1)``, so a window that fits at once costs one
        draw.
        """
        self.check_length(length)
        ids: list[int] = []
        for _ in range(MAX_TRIES):
            start = rng.randrange(0, len(self.ids) - length + 1)
            ids = self.ids[start : start + length]
            if (not ids or ids[0] not in avoid_first) and self.round_trips([*after, *ids]):
                break
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def count(self, ids: Sequence[int]) -> int:
        """How many tokens the text of ``ids`` is, as a server with this tokenizer counts it (with the special
        tokens, such as a BOS, that its encoding adds)."""
        return len(self.tokenizer.encode(self.decode(ids)).ids)

    def round_trips(self, ids: Sequence[int]) -> bool:
        """Whether the text of ``ids`` encodes back to exactly them (special tokens the encoding adds aside)."""
        return self.tokenizer.encode(self.decode(ids), add_special_tokens=False).ids == list(ids)
