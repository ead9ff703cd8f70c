"""The one way openinfer opens a file only its owner may read: spec logs, the frontend's state and lock files,
CurveZMQ key files.

Such files can sit in folders others may write (a spec log in ``/tmp``), where someone could plant a symbolic
link in place of the file before it is made (to have openinfer write, or tighten the mode of, a file it
points at) or a file of their own (to read what openinfer writes into it). So a private file is opened with
``O_NOFOLLOW``, and kept only if it is a regular file of this user's, made 0600 (also one that existed, as an
older release wrote them 0644). A new file whose name must not exist yet (a temporary file, a key) is opened
with ``O_EXCL`` as well, after removing a stale one.

It lives in ``openinfer.tools`` because the frontend (which must not import torch) and the engine both open
such files and may both import this package; ``openinfer.protocol`` holds the wire's data only.
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
