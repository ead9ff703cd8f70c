"""Rate limits for the warnings a stranger can provoke (each such event is counted anyway)."""

from __future__ import annotations

import time
from typing import Literal

# The noise a peer can make on the engine sockets: a frame on the request socket, a failed handshake.
NoiseKind = Literal["unexpected", "handshake"]


class LogRateLimiter:
    """At most one warning per ``interval_s`` seconds per kind of noise."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self._last: dict[NoiseKind, float] = {}  # kind -> time.monotonic() of the last such warning

    def allow(self, kind: NoiseKind) -> bool:
        """Whether a warning of ``kind`` may be logged now (and if so, it counts as logged)."""
        now = time.monotonic()
        if now - self._last.get(kind, -self.interval_s) < self.interval_s:
            return False
        self._last[kind] = now
        return True
