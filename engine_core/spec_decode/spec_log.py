"""``--spec-log``: one JSON line per draft, the ground truth that /metrics is checked against."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import IO

import msgspec

from openinfer.protocol.spec_log import SpecLogLine
from openinfer.tools.private_file import APPEND, open_private


class SpecLog:
    """Appends lines to a file; flushed once per engine step so a crash loses at most one step."""

    def __init__(self, path: Path, engine_index: int, incarnation: int) -> None:
        # Private: the incarnation it names is what a local process needs to pose as this engine. The file
        # is 0600 (also one an older release made readable to all), a folder made here 0700; a symbolic link
        # or another user's file in its place is refused (ValueError: the engine cannot start so).
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._file: IO[bytes] = os.fdopen(open_private(path, APPEND), "ab")
        except OSError as e:
            raise ValueError(f"--spec-log: {e}") from None
        self._encoder = msgspec.json.Encoder()
        self._engine_index = engine_index
        self._incarnation = f"{incarnation:016x}"

    def write(self, request_id: str, num_spec_tokens: int, num_draft_tokens: int, num_accepted: int) -> None:
        line = SpecLogLine(
            time.time(),
            self._engine_index,
            self._incarnation,
            request_id,
            num_spec_tokens,
            num_draft_tokens,
            num_accepted,
        )
        self._file.write(self._encoder.encode(line) + b"\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
