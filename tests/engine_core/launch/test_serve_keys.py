"""openinfer-serve's CurveZMQ keys: made for each run in a private folder unless --zmq-curve-keys DIR is given,
removed when serve exits; secret key files private from the moment they exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer.engine_core.launch.serve import (
    engine_command,
    frontend_command,
    parse_args,
    prepare,
    remove_private_keys,
)
from openinfer.frontend.engines.server_keys import make_keys


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_keys_are_private_files_in_private_folders(tmp_path: Path) -> None:
    """openinfer-keys DIR: the folders it makes are 0700 and every key file 0600 (the public ones too: they
    are copied to engine hosts, never read by others in place); it never overwrites keys."""
    folder = tmp_path / "keys"
    written = make_keys(folder, 2)
    assert mode(folder) == 0o700 and mode(folder / "engines") == 0o700
    secrets = sorted(p.name for p in written if p.suffix == ".key_secret")
    assert secrets == ["engine-0.key_secret", "engine-1.key_secret", "frontend.key_secret"]
    assert len(written) == 6 and all(mode(p) == 0o600 for p in written)
    with pytest.raises(ValueError, match="keys exist already"):
        make_keys(folder, 1)


def test_a_link_planted_in_place_of_a_key_is_never_followed(tmp_path: Path) -> None:
    """A dangling symbolic link where a key file goes (a folder others could write): the keys are refused
    as existing, and nothing is written where the link points."""
    folder = tmp_path / "keys"
    folder.mkdir()
    (folder / "frontend.key").symlink_to(tmp_path / "written-through-the-link")
    with pytest.raises(ValueError, match="keys exist already"):
        make_keys(folder, 1)
    assert not (tmp_path / "written-through-the-link").exists()


def test_serve_makes_keys_for_the_run_and_removes_them() -> None:
    """No --zmq-curve-keys: a new private folder with keys for the frontend and each engine, named on both
    children's command lines; remove_private_keys (at exit) deletes it."""
    args = parse_args(["--fake-model", "--engines", "2"])
    prepare(args)
    folder = args.private_keys
    try:
        assert folder is not None and args.zmq_curve_keys == folder and mode(folder) == 0o700
        assert (folder / "frontend.key_secret").is_file()
        assert (folder / "engines" / "engine-1.key_secret").is_file()
        assert f"--zmq-curve-keys={folder}" in engine_command(args, 1)
        assert f"--zmq-curve-keys={folder}" in frontend_command(args)
    finally:
        remove_private_keys(args)
    assert not folder.exists()


def test_given_keys_win_and_are_never_removed(tmp_path: Path) -> None:
    """--zmq-curve-keys DIR: its keys are used (made there when it has none) and stay when serve exits."""
    keys = tmp_path / "keys"
    args = parse_args(["--fake-model", "--zmq-curve-keys", str(keys)])
    prepare(args)
    assert args.private_keys is None and args.zmq_curve_keys == keys
    remove_private_keys(args)
    assert (keys / "frontend.key_secret").is_file()
