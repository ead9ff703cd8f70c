"""The one way openinfer opens a file only its owner may read: spec logs, the frontend's state and lock files,
CurveZMQ key files.

Such files can sit in folders others may write (a spec log in ``/tmp``), where someone could plant a symbolic
link in place of the file before it is made (to have openinfer write, or tighten the mode of, a file it
points at) or a file of their own (to read what openinfer writes into it). So a private file is opened with
``O_NOFOLLOW``, and kept only if it is a regular file of this user's, made 0600 (also one that existed, as an
older release wrote them 0644). A new file whose name must not exist yet (a temporary file, a key) is opened
with ``O_EXCL`` as well, after removing a stale one; :func:`replace_private` writes a whole file that way
and renames it into place. A folder of such files that several processes meet in (the api servers' peers
folder) must be one no other user can write: :func:`check_private_folder`.

It lives in ``openinfer.protocol``, the lowest package the frontend and the engine share (it needs only ``os``),
because both processes open such files and runtime code never imports ``openinfer.tools``.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND  # a log, or a lock file: kept and added to
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # a new file, where nothing may be yet
READ = os.O_RDONLY


def open_private(path: Path, flags: int) -> int:
    """A file descriptor of ``path`` opened with ``flags`` (:data:`APPEND`, :data:`CREATE` or :data:`READ`),
    never through a symbolic link, and only when it is a regular file of this user's; the file is 0600 from
    the moment it exists, and made 0600 if it existed. OSError saying what to do otherwise."""
    not_regular = f"{path} is not a regular file: remove it, or give another path"
    # O_NONBLOCK: a FIFO planted there must not block the open (without a reader it fails with ENXIO).
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP and path.is_symlink():
            raise OSError(
                f"{path} is a symbolic link, and openinfer never follows one to a file it keeps private: "
                "remove the link, or give a path in a folder only you can write"
            ) from None
        if e.errno == errno.ENXIO:
            raise OSError(not_regular) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(not_regular)
        if info.st_uid != os.geteuid():
            raise OSError(
                f"{path} belongs to another user (uid {info.st_uid}), who could read it: remove it, or give "
                "a path in a folder only you can write"
            )
        os.fchmod(fd, 0o600)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace_private(path: Path, data: bytes, durable: bool = False) -> None:
    """Make ``data`` the content of private file ``path`` atomically: a reader sees the old file or the new
    one, never a mix. It is written to a temporary file beside it, opened as :data:`CREATE` (one a crash
    left, or a link planted there, is removed first: never written through), then renamed over ``path``
    (which replaces a link planted at ``path`` itself, never the file it points at). ``durable``: fsynced,
    the rename too, so that it survives a crash of the machine."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.unlink(missing_ok=True)
    with os.fdopen(open_private(temp, CREATE), "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(temp, path)
    if durable:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def check_private_folder(path: Path) -> None:
    """Make ``path`` (0700) unless it exists; OSError, saying what to do, unless it is a folder of this
    user's that no other user may write. In a folder others may write, they could plant links, files and
    sockets in place of openinfer's, or remove them (the sticky bit of /tmp does not keep them from planting).
    The folder's own path is not followed if it is a link (whose owner could point it elsewhere)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise OSError(f"{path} is a symbolic link: give the folder it points at, if only you can write it")
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{path} is not a folder")
    if info.st_uid != os.geteuid():
        raise OSError(
            f"{path} belongs to another user (uid {info.st_uid}), who could plant files in it: give a folder "
            "of your own, only you can write (mkdir -m 700 DIR)"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OSError(
            f"{path} can be written by other users (mode {stat.S_IMODE(info.st_mode):o}), who could plant "
            f"files in it: chmod go-w {path}, or give a folder only you can write (mkdir -m 700 DIR)"
        )
