"""Streamed text cut at literal tags (``<think>``, ``<tool_call>``, ...), however the deltas split them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tag:
    """One occurrence of a tag in the text."""

    text: str


class TagScanner:
    """Cuts text arriving in pieces into plain text and :class:`Tag` s, in order.

    A tag found split across deltas is found all the same: text that ends with the start of a tag is held
    back until the next delta says whether the tag completes, and :meth:`finish` releases what is held.
    The pieces joined (a tag as its text) are always exactly the text fed.
    """

    def __init__(self, tags: tuple[str, ...]) -> None:
        assert tags and all(tags), "tags must be non-empty strings"
        self._tags = tags
        self._held = ""  # the end of the text so far, which may be the start of a tag

    def feed(self, text: str) -> list[str | Tag]:
        """The pieces ``text`` completes; plain text pieces are never empty."""
        buffer = self._held + text
        pieces: list[str | Tag] = []
        start = 0
        while True:
            found = self._next_tag(buffer, start)
            if found is None:
                break
            at, tag = found
            if at > start:
                pieces.append(buffer[start:at])
            pieces.append(Tag(tag))
            start = at + len(tag)
        keep = self._partial_tag_length(buffer, start)
        if len(buffer) - keep > start:
            pieces.append(buffer[start : len(buffer) - keep])
        self._held = buffer[len(buffer) - keep :]
        return pieces

    def finish(self) -> list[str | Tag]:
        """What is held at the end of the text: it never completed a tag, so it is plain text."""
        held, self._held = self._held, ""
        return [held] if held else []

    def _next_tag(self, buffer: str, start: int) -> tuple[int, str] | None:
        """The first tag in ``buffer[start:]``, with where it starts (the longest where two start there)."""
        best: tuple[int, str] | None = None
        for tag in self._tags:
            at = buffer.find(tag, start)
            if at >= 0 and (best is None or at < best[0] or (at == best[0] and len(tag) > len(best[1]))):
                best = (at, tag)
        return best

    def _partial_tag_length(self, buffer: str, start: int) -> int:
        """The length of the longest end of ``buffer[start:]`` that a tag starts with (but is not)."""
        longest = 0
        for tag in self._tags:
            for length in range(min(len(tag) - 1, len(buffer) - start), longest, -1):
                if tag.startswith(buffer[len(buffer) - length :]):
                    longest = length
                    break
        return longest
