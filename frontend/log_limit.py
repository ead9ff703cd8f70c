"""Rate limits for the log lines a peer on the engine sockets can provoke.

Each such event is counted anyway (``openinfer:protocol_errors_total{kind}`` and the engine metrics), so the
log only needs enough lines to say what is going on: a peer flooding the sockets must not fill the disk, nor
stall the event loop writing lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

# Lines of one kind logged at once before the rate applies: engines starting together each get their line.
BURST = 10


@dataclass
class _Budget:
    """One kind's token bucket."""

    tokens: float  # lines it may log now
    refilled: float  # clock() when ``tokens`` was last topped up
    held_back: int = 0  # lines dropped since the last one logged


class LogRateLimiter:
    """Per kind of line: ``burst`` lines at once, then one per ``interval_s`` seconds; the next line logged
    after some were held back says how many.

    A kind is any short label: the protocol error kinds (``undecodable``, ``seq``...) and the boundary's own
    events (``joined``, ``down``...). Lines of different kinds never hold each other back.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 1.0,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (interval_s > 0 and burst >= 1):
            raise ValueError(f"need interval_s > 0 and burst >= 1, got {interval_s} and {burst}")
        self.logger = logger
        self.interval_s = interval_s
        self.burst = burst
        self._clock = clock
        self._budgets: dict[str, _Budget] = {}  # by kind; the kinds are a fixed, small set

    def allow(self, kind: str) -> bool:
        """Whether a line of ``kind`` may be logged now (if so, it is taken from the budget)."""
        now = self._clock()
        budget = self._budgets.get(kind)
        if budget is None:
            budget = self._budgets[kind] = _Budget(self.burst, now)
        budget.tokens = min(self.burst, budget.tokens + (now - budget.refilled) / self.interval_s)
        budget.refilled = now
        if budget.tokens < 1:
            budget.held_back += 1
            return False
        budget.tokens -= 1
        return True

    def log(self, level: int, kind: str, message: str, *args: object, exc_info: bool = False) -> None:
        """Log ``message % args`` at ``level`` unless ``kind``'s budget is spent (then it is only tallied)."""
        if not self.allow(kind):
            return
        budget = self._budgets[kind]
        if budget.held_back:
            message += " [%d more like this were not logged]"
            args = (*args, budget.held_back)
            budget.held_back = 0
        self.logger.log(level, message, *args, exc_info=exc_info)

    def info(self, kind: str, message: str, *args: object) -> None:
        self.log(logging.INFO, kind, message, *args)

    def warning(self, kind: str, message: str, *args: object) -> None:
        self.log(logging.WARNING, kind, message, *args)
