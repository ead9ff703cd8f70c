"""n-gram prompt lookup with vLLM's semantics."""

from __future__ import annotations

from openinfer.engine_core.spec_decode.ngram import ngram_propose


def test_longest_suffix_match_wins() -> None:
    """The 3-gram [1, 2, 3] occurred at 0, so the tokens after it are proposed, not those after [3]."""
    tokens = [1, 2, 3, 9, 3, 7, 1, 2, 3]
    assert ngram_propose(tokens, 1, 3, 4) == [9, 3, 7, 1]


def test_earliest_occurrence_among_equal_matches() -> None:
    """[5, 6] occurs at 0 and 3: the earliest one's continuation is proposed."""
    assert ngram_propose([5, 6, 1, 5, 6, 2, 5, 6], 2, 2, 1) == [1]


def test_fewer_when_sequence_ends_first() -> None:
    """Only the tokens that exist after the match are proposed."""
    assert ngram_propose([4, 8, 4], 1, 4, 7) == [8, 4]


def test_no_match_no_draft() -> None:
    """Nothing matches: no proposal (not an empty draft)."""
    assert ngram_propose([1, 2, 3, 4], 1, 4, 5) == []
    assert ngram_propose([1, 2, 3, 1], 2, 4, 5) == []  # only a 1-gram matches, min is 2


def test_max_drafts_bounds_the_proposal() -> None:
    """max_drafts (K, or what max_tokens leaves) caps the proposal; 0 proposes nothing."""
    tokens = [1, 2, 3, 4, 5, 1]
    assert ngram_propose(tokens, 1, 4, 2) == [2, 3]
    assert ngram_propose(tokens, 1, 4, 0) == []
