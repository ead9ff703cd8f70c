"""Stop strings found in generated text as it streams in, whatever the chunking."""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Releases text as it arrives, holding back only what could still start a stop string.

    The match that ends the text is the occurrence of any stop string that is complete first (the smallest
    end position; on a tie, the one that starts first). It is the same however the text is cut into
    chunks, because text is released only once no stop string can start in it. The output ends right before
    the stop string, or right after it with ``include_stop_str_in_output`` (vLLM's extension); nothing after
    it is ever released. Empty stop strings are ignored.
    """

    def __init__(self, stops: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        self.stops = tuple(dict.fromkeys(s for s in stops if s))  # unique, in order
        self._include = include_stop_str_in_output
        self._held = ""  # text received but not released: the longest suffix that begins a stop string
        self.match: str | None = None  # the stop string that ended the text, once one has

    def feed(self, text: str) -> str:
        """Add generated text; return what can be released now. The call that finds a stop string sets
        ``match`` and returns the last of the text; every later call returns ""."""
        if self.match is not None:
            return ""
        buffer = self._held + text
        found = self._first_match(buffer)
        if found is not None:
            start, stop = found
            end = start + len(stop) if self._include else start
            self._held = ""
            self.match = stop
            return buffer[:end]
        keep = self._stop_prefix_length(buffer)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The generation ended without a stop string: release what was held back."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, text: str) -> tuple[int, str] | None:
        """(start, stop string) of the occurrence that ends first, or None."""
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self.stops:
            start = text.find(stop)  # a string's first occurrence is also its first to end
            if start >= 0:
                candidate = (start + len(stop), start, stop)
                if best is None or candidate[:2] < best[:2]:
                    best = candidate
        return None if best is None else (best[1], best[2])

    def _stop_prefix_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stops:
            # Candidates start where the stop string's first character occurs in the last len(stop) - 1
            # characters; the earliest that fits is this stop string's longest.
            first = max(len(text) - len(stop) + 1, 0)
            position = text.find(stop[0], first)
            while position >= 0 and len(text) - position > longest:
                if stop.startswith(text[position:]):
                    longest = len(text) - position
                    break
                position = text.find(stop[0], position + 1)
        return longest
