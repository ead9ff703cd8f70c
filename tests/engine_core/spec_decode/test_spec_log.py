"""--spec-log: files are private (the incarnation each line names is what a stranger needs to pose as the
engine); a line per round with its verified and proposed counts and its confidences, read back into the
engine's counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openinfer.engine_core.spec_decode.spec_log import SpecLog
from openinfer.protocol import SpecDecodeCounters
from openinfer.protocol.counters import CONFIDENCE_SCALE
from openinfer.protocol.spec_log import parse_spec_log_line


def test_spec_log_is_0600_in_a_folder_made_0700(tmp_path: Path) -> None:
    """A new log is 0600 in a folder made 0700; an existing one (an older release wrote 0644) is tightened
    and appended to."""
    path = tmp_path / "logs" / "spec.jsonl"
    log = SpecLog(path, 0, 0xABC)
    log.write("r1", 3, 3, 1)
    log.close()
    assert (path.parent.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o700, 0o600)
    path.chmod(0o644)
    log = SpecLog(path, 0, 0xDEF)
    log.write("r2", 3, 3, 2)
    log.close()
    assert path.stat().st_mode & 0o777 == 0o600
    assert [line.count(b"0000000000000abc") for line in path.read_bytes().splitlines()] == [1, 0]


def test_a_link_in_place_of_the_spec_log_is_refused(tmp_path: Path) -> None:
    """A symbolic link planted where the spec log goes (as in a folder others can write) is refused with a
    ValueError naming the flag and what to do (the engine exits 2 on it), and its target stays as it was."""
    target = tmp_path / "someone-elses-file"
    target.write_bytes(b"kept\n")
    target.chmod(0o644)
    link = tmp_path / "spec.jsonl"
    link.symlink_to(target)
    with pytest.raises(ValueError, match=f"^--spec-log: {link} is a symbolic link, .*remove the link"):
        SpecLog(link, 0, 0xABC)
    assert (target.read_bytes(), target.stat().st_mode & 0o777) == (b"kept\n", 0o644)


def test_lines_name_the_seq_of_the_message_that_carries_them(tmp_path: Path) -> None:
    """A line names the seq of the next message the engine sends, and is in the file before that message
    leaves (``sending``); lines written after it name the one after."""
    path = tmp_path / "spec.jsonl"
    log = SpecLog(path, 2, 0xABC)
    log.sending(0)  # the hello
    log.write("r1", 3, 3, 1)
    log.write("r2", 3, 2, 2)
    assert path.read_bytes() == b""  # a step's lines are written together
    log.sending(1)  # the step's outputs carry both
    log.write("r1", 3, 3, 0)
    log.close()
    lines = [parse_spec_log_line(line) for line in path.read_bytes().splitlines()]
    assert [(line.request_id, line.engine_index, line.seq) for line in lines] == [
        ("r1", 2, 1),
        ("r2", 2, 1),
        ("r1", 2, 2),
    ]


def test_a_line_cut_by_a_kill_is_ended_before_the_next_incarnation_writes(tmp_path: Path) -> None:
    """A file ending in a cut line gets a newline before the next incarnation's first line: the cut line
    stays one unreadable line, and the new line is whole; an incarnation that writes none leaves it as it is."""
    path = tmp_path / "spec.jsonl"
    path.write_bytes(b'{"time": 1.0, "engine_ind')
    path.chmod(0o600)
    SpecLog(path, 0, 0xABC).close()  # drafted nothing
    assert path.read_bytes() == b'{"time": 1.0, "engine_ind'
    log = SpecLog(path, 0, 0xDEF)
    log.sending(0)
    log.write("r1", 3, 3, 2)
    log.close()
    cut, whole = path.read_bytes().splitlines()
    assert cut == b'{"time": 1.0, "engine_ind'
    assert parse_spec_log_line(whole).incarnation == "0000000000000def"


def test_lines_name_verified_and_proposed_counts(tmp_path: Path) -> None:
    """A draft verified whole names P = V; a trimmed one V < P; a round verifying nothing is a line with V = 0
    (only its unverified tokens count). Replayed, they make the counters the engine's observe_* calls make."""
    path = tmp_path / "spec.jsonl"
    log = SpecLog(path, 0, 0xABC)
    log.write("r1", 4, 4, 2)
    log.write("r2", 4, 2, 1, num_proposed_tokens=4)
    log.write("r3", 4, 0, 0, num_proposed_tokens=3)
    log.close()
    lines = [parse_spec_log_line(line) for line in path.read_bytes().splitlines()]
    assert [(x.num_draft_tokens, x.num_accepted, x.num_proposed_tokens) for x in lines] == [
        (4, 2, 4),
        (2, 1, 4),
        (0, 0, 3),
    ]
    replayed = SpecDecodeCounters.zero(4)
    for line in lines:
        line.observe_into(replayed)
    engine = SpecDecodeCounters.zero(4)
    engine.observe_draft(4, 2)
    engine.observe_draft(2, 1, num_unverified=2)
    engine.observe_unverified(3)
    assert replayed == engine
    assert (replayed.num_draft_tokens_per_pos, replayed.num_unverified_draft_tokens) == ([2, 2, 1, 1], 5)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"num_draft_tokens": 0, "num_accepted": 0},
            "0 tokens verified of 0 proposed",
        ),  # an older empty draft
        ({"num_draft_tokens": 3, "num_accepted": 1, "num_proposed_tokens": 2}, "3 tokens verified of 2"),
        ({"num_draft_tokens": 2, "num_accepted": 1, "num_proposed_tokens": 5}, "of 5 proposed with K=4"),
        ({"num_draft_tokens": 0, "num_accepted": 1, "num_proposed_tokens": 2}, "1 accepted of 0 tokens"),
    ],
)
def test_impossible_rounds_are_refused(fields: dict[str, int], message: str) -> None:
    """A line proposing nothing, verifying more than it proposed, proposing more than K, or accepting
    unverified tokens is no possible round: ValueError saying so."""
    line = {"time": 1.0, "engine_index": 0, "incarnation": "0000000000000abc", "request_id": "r",
            "num_spec_tokens": 4, **fields}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        parse_spec_log_line(json.dumps(line))


def test_lines_of_a_release_without_proposed_counts_read_as_whole_drafts() -> None:
    """A line without ``num_proposed_tokens`` (an older release) is a draft verified whole: P = V."""
    line = parse_spec_log_line(
        '{"time": 1.0, "engine_index": 0, "incarnation": "0000000000000abc", "request_id": "r", '
        '"num_spec_tokens": 4, "num_draft_tokens": 3, "num_accepted": 1, "seq": 2}'
    )
    assert (line.num_proposed_tokens, line.num_proposed) == (None, 3)
    assert line.confidence_micros == []  # nor confidences: the draft adds to reached only


def test_lines_carry_the_confidences_as_counted(tmp_path: Path) -> None:
    """A draft with confidences names them as the integers the counters add (round(c * 1e6)), a draft
    without them an empty list; replayed, the lines make the engine's counters, confidence sums included."""
    path = tmp_path / "spec.jsonl"
    log = SpecLog(path, 0, 0xABC)
    log.write("r1", 4, 3, 1, num_proposed_tokens=4, confidence=[0.9, 0.4000004, 0.2])
    log.write("r2", 4, 2, 2)
    log.write("r3", 4, 4, 4, confidence=[1.0, 0.75, 0.5, 0.0])
    log.close()
    lines = [parse_spec_log_line(line) for line in path.read_bytes().splitlines()]
    assert [x.confidence_micros for x in lines] == [
        [900_000, 400_000, 200_000],
        [],
        [1_000_000, 750_000, 500_000, 0],
    ]
    replayed = SpecDecodeCounters.zero(4)
    for line in lines:
        line.observe_into(replayed)
    engine = SpecDecodeCounters.zero(4)
    engine.observe_draft(3, 1, num_unverified=1, confidence=[0.9, 0.4000004, 0.2])
    engine.observe_draft(2, 2)
    engine.observe_draft(4, 4, confidence=[1.0, 0.75, 0.5, 0.0])
    assert replayed == engine
    # reached: tokens 0-1 of r1 (token 1 rejected), 0-1 of r2 (V = 2), all of r3
    assert replayed.num_reached_per_pos == [3, 3, 1, 1]
    assert replayed.confidence_micros_per_pos == [1_900_000, 1_150_000, 500_000, 0]


def test_every_micro_round_trips_through_a_line() -> None:
    """For every m in 0..1e6, a line's m replays as the confidence m / 1e6 that observe_draft counts as m
    again: the log rebuilds the counters exactly, whatever the confidence."""
    assert all(round(m / CONFIDENCE_SCALE * CONFIDENCE_SCALE) == m for m in range(CONFIDENCE_SCALE + 1))


@pytest.mark.parametrize(
    ("micros", "message"),
    [([500_000], "for 2 verified tokens"), ([1, 2, 3], "for 2 verified"), ([1_000_001, 0], "in 0..1000000"),
     ([-1, 0], "in 0..1000000")],
)  # fmt: skip
def test_impossible_confidences_in_a_line_are_refused(micros: list[int], message: str) -> None:
    """A line's confidences are one per verified token, each 0..1e6: otherwise ValueError."""
    line = {"time": 1.0, "engine_index": 0, "incarnation": "0000000000000abc", "request_id": "r",
            "num_spec_tokens": 4, "num_draft_tokens": 2, "num_accepted": 1, "confidence_micros": micros}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        parse_spec_log_line(json.dumps(line))
