"""``--spec-log``: one JSON line per round, the ground truth that /metrics is checked against.

A line holds a round's verified count (``num_draft_tokens``, V) and proposed count (``num_proposed_tokens``,
P >= V); a round the scheduler verified none of (V = 0, P >= 1) has its line too, so that the unverified
tokens reconcile with ``openinfer:spec_decode_num_unverified_draft_tokens_total``. A draft from a drafter
with a confidence head (DSpark) also holds each verified token's confidence as the integer the counters
added (``confidence_micros``: round(c * 1e6)), so the log rebuilds
``openinfer:spec_decode_confidence_micros_per_pos_total`` exactly.

Each line names ``seq``: the seq of the first message the engine sends after writing it, which is the first
load snapshot whose counters hold that draft (every message carries the cumulative counters). A reader that
knows the last seq a frontend counted of an incarnation splits that incarnation's lines exactly into those in
/metrics and an unsent tail (an engine killed between a step and its message), whatever the instant of the
kill: ``openinfer-verify-log --engines-url``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from openinfer.protocol.counters import confidence_micros
from openinfer.protocol.private_file import APPEND, READ, open_private
from openinfer.protocol.spec_log import SpecLogLine


class SpecLog:
    """Appends lines to a file, a step's lines in one write at its end (:meth:`flush`): a kill loses at most
    that step's lines, which no snapshot sent holds either."""

    def __init__(self, path: Path, engine_index: int, incarnation: int) -> None:
        # Private: the incarnation it names is what a local process needs to pose as this engine. The file
        # is 0600 (also one an older release made readable to all), a folder made here 0700; a symbolic link
        # or another user's file in its place is refused (ValueError: the engine cannot start so).
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd = open_private(path, APPEND)
            # An engine killed while writing left a cut line: it is ended before this incarnation's first
            # line, so that it stays one bad line of the dead incarnation instead of swallowing ours (and
            # stays last in the file, without its newline, while this incarnation writes none).
            self._ends_cut = _ends_cut(path)
        except OSError as e:
            raise ValueError(f"--spec-log: {e}") from None
        self._encoder = msgspec.json.Encoder()
        self._pending: list[bytes] = []  # this step's lines
        self._engine_index = engine_index
        self._incarnation = f"{incarnation:016x}"
        # The seq of the engine's next message (its process moves it as it sends: :meth:`sending`).
        self.next_seq = 0

    def sending(self, seq: int) -> None:
        """The engine is sending its message ``seq``: the lines it carries are written first (so a kill never
        leaves a counted draft out of the file), and lines written from now on name a later one."""
        self.flush()
        self.next_seq = seq + 1

    def write(
        self,
        request_id: str,
        num_spec_tokens: int,
        num_draft_tokens: int,
        num_accepted: int,
        num_proposed_tokens: int | None = None,
        confidence: Sequence[float] | None = None,
    ) -> None:
        """One round: ``num_draft_tokens`` verified (0: none), ``num_accepted`` of them accepted, of
        ``num_proposed_tokens`` proposed (None: all of them were verified); ``confidence``: the verified
        tokens' confidences (None without a confidence head), written as the integers the counters add."""
        line = SpecLogLine(
            time.time(),
            self._engine_index,
            self._incarnation,
            request_id,
            num_spec_tokens,
            num_draft_tokens,
            num_accepted,
            self.next_seq,
            num_draft_tokens if num_proposed_tokens is None else num_proposed_tokens,
            [] if confidence is None else confidence_micros(confidence, num_draft_tokens),
        )
        self._pending.append(self._encoder.encode(line) + b"\n")

    def flush(self) -> None:
        """Write the step's lines (once per step, before its outputs are sent)."""
        if not self._pending:
            return
        data, self._pending = b"".join(self._pending), []
        if self._ends_cut:
            data, self._ends_cut = b"\n" + data, False
        _write_all(self._fd, data)

    def close(self) -> None:
        self.flush()
        os.close(self._fd)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _ends_cut(path: Path) -> bool:
    """Whether the file's last byte is not a newline (a line cut short by a kill); False when it is empty."""
    with os.fdopen(open_private(path, READ), "rb") as file:
        if file.seek(0, os.SEEK_END) == 0:
            return False
        file.seek(-1, os.SEEK_END)
        return file.read(1) != b"\n"
