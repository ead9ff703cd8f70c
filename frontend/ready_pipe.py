"""How a frontend that ``openinfer-serve`` started says it got through its start (its flags, keys, state
folder and engine ports work; it serves on serve's listening socket): one line on a pipe the launcher gave it.

The launcher holds the pipe's read end, so the line stays there to be read after the frontend is gone: whether
a dead frontend had got ready is a fact, not a guess from polling ``/health`` between its start and its death
(one that was ready is started again; one that died before, with an engine port taken or an unusable
``--state-dir``, cannot start, so it is not). Both ends are here; this module imports nothing of the frontend's.
"""

from __future__ import annotations

import os

READY_FD_ENV = "OPENINFER_READY_FD"  # the pipe's write end, as a file descriptor number in the frontend
READY_LINE = b"ready\n"


def say_ready() -> None:
    """In the frontend, once it got through its start: write the line to the launcher's pipe, if it gave one
    (else nothing), and close it, so that no process the frontend starts holds it."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is not None:
        with os.fdopen(int(fd), "wb") as pipe:
            pipe.write(READY_LINE)


class ReadyPipe:
    """In the launcher: the pipe, given to each start of one child (:attr:`env` and :attr:`pass_fds`);
    closed when its ``with`` block ends.

    Each start writes its line once; the child is started again only after its death was seen and
    :meth:`said_ready` read what it wrote, so whatever is in the pipe was written by the start running now.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # neither is inherited but by the child given pass_fds
        os.set_blocking(self._read, False)

    @property
    def env(self) -> dict[str, str]:
        return {READY_FD_ENV: str(self._write)}

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._write,)

    def said_ready(self) -> bool:
        """True when the child wrote its line since the last call (also when it has died since)."""
        try:
            return bool(os.read(self._read, 4096))
        except BlockingIOError:
            return False

    def __enter__(self) -> ReadyPipe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        os.close(self._read)
        os.close(self._write)
