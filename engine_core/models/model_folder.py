"""Which files of a model folder the engine opens: regular files inside it, never a FIFO, a device or a path
that leads out of it (a hostile or broken checkpoint must fail at start with a message, not hang or read
/dev/zero)."""

from __future__ import annotations

import stat
from pathlib import Path, PurePosixPath


def model_file(folder: Path, name: str) -> Path:
    """folder/name, if it is a regular file of the model folder; else ValueError saying why.

    The name must be relative without "..", and the file it resolves to (symlinks followed) inside the folder
    or, in a Hugging Face cache snapshot (.../snapshots/REV, whose files link to ../../blobs/HASH), in its
    blobs folder. Only stat is called: a FIFO, whose open blocks until a writer comes, is never opened."""
    path = folder / name
    if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
        raise ValueError(f"{folder}: {name!r} is outside the model folder; name the files inside it")
    try:
        resolved = path.resolve(strict=True)
        mode = resolved.stat().st_mode
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop
        raise ValueError(f"{path} cannot be read: {e}") from e
    root = folder.resolve()
    roots = [root, root.parent.parent / "blobs"] if root.parent.name == "snapshots" else [root]
    if not any(resolved.is_relative_to(each) for each in roots):
        raise ValueError(f"{path} leads to {resolved}, outside the model folder; copy the file into it")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path} is {_file_kind(mode)}, not a regular file; put the file itself there")
    return path


def _file_kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket"}
    return next((kind for is_kind, kind in kinds.items() if is_kind(mode)), "a device")
