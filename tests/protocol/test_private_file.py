"""open_private: the one way openinfer opens its private files (spec logs, state files, keys): never through a
symbolic link, only a regular file, always 0600."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from openinfer.protocol.private_file import APPEND, CREATE, READ, open_private


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_new_and_existing_files_are_0600(tmp_path: Path) -> None:
    """A file made by APPEND or CREATE is 0600; one that existed 0644 is tightened and appended to."""
    made, existing = tmp_path / "made", tmp_path / "existing"
    os.close(open_private(made, CREATE))
    existing.write_bytes(b"a")
    existing.chmod(0o644)
    with os.fdopen(open_private(existing, APPEND), "ab") as f:
        f.write(b"b")
    assert (mode(made), mode(existing), existing.read_bytes()) == (0o600, 0o600, b"ab")
    with os.fdopen(open_private(existing, READ), "rb") as f:
        assert f.read() == b"ab"


@pytest.mark.parametrize("flags", [APPEND, READ])
def test_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path: Path, flags: int) -> None:
    """A link planted in the file's place (to a file, or dangling) is refused saying so and what to do;
    the file it points at is neither written, made nor tightened."""
    target, dangling = tmp_path / "target", tmp_path / "nothing-yet"
    target.write_bytes(b"precious")
    target.chmod(0o644)
    for link_to in (target, dangling):
        link = tmp_path / f"link-to-{link_to.name}"
        link.symlink_to(link_to)
        with pytest.raises(OSError, match=f"^{link} is a symbolic link, .*remove the link"):
            open_private(link, flags)
    assert (target.read_bytes(), mode(target), dangling.exists()) == (b"precious", 0o644, False)


def test_create_refuses_any_name_that_exists(tmp_path: Path) -> None:
    """CREATE (a key, a temporary file) refuses a file, or a link, already there: nothing is followed."""
    (tmp_path / "file").write_bytes(b"")
    (tmp_path / "link").symlink_to(tmp_path / "nothing-yet")
    for name in ("file", "link"):
        with pytest.raises(FileExistsError):
            open_private(tmp_path / name, CREATE)
    assert not (tmp_path / "nothing-yet").exists()


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO in the file's place is refused as not a regular file, with or without a reader at its other
    end; opening it does not wait for one (were it to, this test would hang until its timeout)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="is not a regular file"):
        open_private(fifo, APPEND)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # now the write-open succeeds, and is checked
    try:
        with pytest.raises(OSError, match="is not a regular file"):
            open_private(fifo, APPEND)
    finally:
        os.close(reader)
    with pytest.raises(OSError, match="is not a regular file"):
        open_private(fifo, READ)
