"""The stop-string matcher: exact truncation, minimal hold-back, and independence from chunking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openinfer.frontend.openai.stop_strings import StopStringMatcher

# A small alphabet so that stop strings really occur, partially and overlapping.
TEXT = st.text(alphabet="abc\n", max_size=40)
STOPS = st.lists(st.text(alphabet="abc\n", min_size=1, max_size=5), min_size=1, max_size=4)


def reference(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """Brute force: the first end position at which some stop string is complete (longest on a tie)."""
    for end in range(1, len(text) + 1):
        complete = [s for s in stops if text[:end].endswith(s)]
        if complete:
            stop = max(complete, key=len)
            return text[: end if include else end - len(stop)], stop
    return text, None


def run(chunks: list[str], stops: list[str], include: bool = False) -> tuple[str, str | None]:
    matcher = StopStringMatcher(stops, include)
    released = "".join(matcher.feed(chunk) for chunk in chunks)
    if matcher.match is None:
        released += matcher.flush()
        return released, None
    assert matcher.feed("more") == ""  # nothing after the stop string
    return released, matcher.match


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@given(TEXT, STOPS, st.lists(st.integers(min_value=0, max_value=40), max_size=12), st.booleans())
def test_chunking_never_changes_the_result(
    text: str, stops: list[str], cuts: list[int], include: bool
) -> None:
    """Any split of the text into chunks (empty ones too) gives the brute-force reference's result."""
    assert run(split(text, cuts), stops, include) == reference(text, stops, include)
    assert run(list(text), stops, include) == reference(text, stops, include)  # one character at a time


@given(TEXT, STOPS)
def test_only_possible_stop_starts_are_held_back(text: str, stops: list[str]) -> None:
    """Without a match, all text is released except the longest suffix that begins some stop string."""
    matcher = StopStringMatcher(stops)
    released = matcher.feed(text)
    if matcher.match is None:
        held = text[len(released) :]
        assert text.startswith(released)
        assert all(not any(s.startswith(text[i:]) for s in stops) for i in range(len(text) - len(held)))
        assert not held or any(s.startswith(held) and s != held for s in stops)


@pytest.mark.parametrize(
    ("chunks", "stops", "include", "expected"),
    [
        (["Hello wor", "ld. Bye"], ["world"], False, ("Hello ", "world")),
        (["Hello wor", "ld. Bye"], ["world"], True, ("Hello world", "world")),
        (["ab", "cd"], ["abcd", "bc"], False, ("a", "bc")),  # "bc" is complete first
        (["xabc"], ["abc", "bc"], False, ("x", "abc")),  # same end: the longer one, which starts first
        (["no stop here"], ["STOP"], False, ("no stop here", None)),
        (["a\n\n", "b"], ["\n\n"], False, ("a", "\n\n")),
        (["text ends with a partial sto"], ["stop"], False, ("text ends with a partial sto", None)),
    ],
)
def test_examples(
    chunks: list[str], stops: list[str], include: bool, expected: tuple[str, str | None]
) -> None:
    """Literal cases: truncation before (or after) the stop string, and the first-complete rule."""
    assert run(chunks, stops, include) == expected


def test_holds_back_exactly_the_partial_stop() -> None:
    """Text that might start "STOP" waits; once it cannot, it is released at once."""
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("go ST") == "go "
    assert matcher.feed("O") == ""
    assert matcher.feed("RM") == "STORM"
    assert matcher.feed("S") == ""
    assert matcher.flush() == "S"
