"""``--state-dir``: the frontend's exported totals and per-engine baselines, saved together and atomically.

A frontend restarted after SIGKILL loads the file and continues every counter series exactly (docs/design.md,
frontend diffing): its totals are what the last frontend had published, and each engine incarnation it had
seen is diffed against the baseline those totals were published from. The file is written to a temporary
name, fsynced, renamed over the old one and the folder fsynced: a reader sees the old state or the new one,
never a mix. A lock file keeps two frontends from sharing a folder. The files are 0600 and a folder made
here 0700: the incarnations the state names are what a local process needs to pose as an engine. They are
opened by :func:`~openinfer.protocol.private_file.open_private`: a symbolic link in their place is refused.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import IO

import msgspec

from openinfer.frontend.metrics.engine_baselines import SavedBaseline
from openinfer.frontend.metrics.spec_decode.counted_seqs import CountedSeqs
from openinfer.frontend.metrics.totals import TotalsState
from openinfer.protocol import PrefixCacheCounters, SpecDecodeCounters
from openinfer.protocol.private_file import APPEND, READ, open_private, replace_private

logger = logging.getLogger(__name__)

STATE_VERSION = 1  # bumped when FrontendState changes incompatibly (a new field with a default is not)
STATE_FILE = "frontend-state.json"
LOCK_FILE = "frontend.lock"


class FrontendState(msgspec.Struct):
    """What a restarted frontend needs to continue: totals and the baselines they were published from."""

    version: int
    totals: TotalsState
    spec_baselines: dict[int, SavedBaseline[SpecDecodeCounters]]  # by engine index
    incarnations: dict[int, int]  # the latest incarnation of each engine index (to count restarts)
    # by engine index; absent from files of frontends without prefix-cache metrics (none saved then)
    prefix_cache_baselines: dict[int, SavedBaseline[PrefixCacheCounters]] = {}
    # indices whose record was forgotten (their series dropped, never having moved), oldest first: their
    # baselines and incarnations are kept, bounded, so that an engine coming back continues exactly
    forgotten: list[int] = []
    # by engine index: the seqs of each incarnation the totals were counted over (absent from older files)
    counted_seqs: dict[int, list[CountedSeqs]] = {}


class StateError(Exception):
    """The state folder cannot be used: locked by another frontend, or its file is unreadable."""


class StateDir:
    """One frontend's state folder: ``load`` once at start, ``save`` whenever the state may have moved."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path / STATE_FILE
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock: IO[bytes] = os.fdopen(open_private(path / LOCK_FILE, APPEND), "ab")
        except OSError as e:
            raise StateError(f"--state-dir {path}: {e}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the kernel when we die
        except BlockingIOError:
            self._lock.close()
            raise StateError(f"--state-dir {path} is in use by another frontend; give each its own") from None
        self._encoder = msgspec.json.Encoder()
        self._last_saved: bytes | None = None
        self.num_saves = 0

    def load(self) -> FrontendState | None:
        """The saved state, or None when there is none yet; :class:`StateError` when it cannot be read."""
        try:
            with os.fdopen(open_private(self.file, READ), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateError(f"cannot read {self.file}: {e}") from None
        try:
            state = msgspec.json.decode(data, type=FrontendState)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise StateError(
                f"{self.file} is not a frontend state file ({e}); move it away to start all series from zero"
            ) from None
        if state.version != STATE_VERSION:
            raise StateError(
                f"{self.file} has state version {state.version}; this frontend reads version {STATE_VERSION}"
            )
        self._last_saved = data
        return state

    def save(self, state: FrontendState) -> bool:
        """Write ``state`` atomically unless it equals the last state saved; True when written."""
        data = self._encoder.encode(state)
        if data == self._last_saved:
            return False
        replace_private(self.file, data, durable=True)
        self._last_saved = data
        self.num_saves += 1
        return True

    def close(self) -> None:
        self._lock.close()
