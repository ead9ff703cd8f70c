"""--spec-log files are private: the incarnation each line names is what a stranger needs to pose as the
engine."""

from __future__ import annotations

from pathlib import Path

from openinfer.engine_core.spec_decode.spec_log import SpecLog


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
