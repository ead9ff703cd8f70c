"""--spec-log files are private: the incarnation each line names is what a stranger needs to pose as the
engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer.engine_core.spec_decode.spec_log import SpecLog
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
