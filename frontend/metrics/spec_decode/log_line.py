"""The periodic "SpecDecoding metrics" log line, in vLLM's form, over the deltas published in an interval."""

from __future__ import annotations

import asyncio
import logging
import math
import time

from openinfer.frontend.metrics.spec_decode.acceptance_tally import AcceptanceTally
from openinfer.protocol import SpecDecodeCounters

# The name its lines have always carried (README, users' log filters), kept across the move into metrics/.
logger = logging.getLogger("openinfer.frontend.spec_decode_log")


class SpecDecodeLogger:
    """Sums the published spec-decode deltas of all engines and logs them once per interval.

    Per-position rates divide by the drafts that had the position: with engines of different K, position i
    counts only the drafts of engines whose K > i. When verify lengths vary (some draft verified fewer
    tokens than its K: cut short, or trimmed by the scheduler), the line goes on past vLLM's form with each
    position's conditional acceptance (accepted / verified at that position) and the unverified draft tokens.
    Nothing is logged for an interval in which nothing was counted; one whose rounds were all left unverified
    logs only those.
    """

    def __init__(self) -> None:
        self._last_log = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        self.tally = AcceptanceTally()  # the interval's published deltas, summed over engines
        self.drafts_per_pos: list[int] = []  # drafts that had a position i (their K > i)

    def add(self, delta: SpecDecodeCounters) -> None:
        """Count one published delta (one engine, one interval between snapshots)."""
        self.tally.add_counters(delta)
        self.drafts_per_pos.extend([0] * (delta.num_spec_tokens - len(self.drafts_per_pos)))
        for i in range(delta.num_spec_tokens):
            self.drafts_per_pos[i] += delta.num_drafts

    def log(self, now: float | None = None) -> None:
        """Log the interval since the last call (if it had drafts) and start a new one."""
        now = time.monotonic() if now is None else now
        elapsed, self._last_log = now - self._last_log, now
        if self.tally.num_drafts > 0:
            self._log_line(elapsed)
        elif self.tally.num_unverified_tokens > 0:
            logger.info(
                "SpecDecoding metrics: no draft verified, Unverified: %d tokens",
                self.tally.num_unverified_tokens,
            )
        self._reset()

    async def run(self, interval_s: float) -> None:
        """Log every ``interval_s`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            self.log()

    def _log_line(self, elapsed: float) -> None:
        tally = self.tally
        accepted, drafted = tally.num_accepted_tokens, tally.num_draft_tokens
        rates = ", ".join(f"{a / d:.3f}" for a, d in zip(tally.per_pos, self.drafts_per_pos, strict=True))
        varied = ""  # vLLM's form ends before it
        if tally.draft_per_pos != self.drafts_per_pos or tally.num_unverified_tokens:
            varied = (
                f", Per-position conditional acceptance rate: {_rates(tally.conditional_rates())}, "
                f"Unverified: {tally.num_unverified_tokens} tokens"
            )
        if any(tally.confidence_micros_per_pos):  # a confidence head rated the drafts: its calibration
            varied += (
                f", Per-position mean confidence: {_rates(tally.mean_confidences())}, "
                f"Per-position reached acceptance rate: {_rates(tally.reached_rates())}"
            )
        logger.info(
            "SpecDecoding metrics: "
            "Mean acceptance length: %.2f, "
            "Accepted throughput: %.2f tokens/s, "
            "Drafted throughput: %.2f tokens/s, "
            "Accepted: %d tokens, "
            "Drafted: %d tokens, "
            "Per-position acceptance rate: %s, "
            "Avg Draft acceptance rate: %.1f%%%s",
            tally.mean_acceptance_length,  # counts the bonus token
            accepted / elapsed if elapsed > 0 else 0.0,
            drafted / elapsed if elapsed > 0 else 0.0,
            accepted,
            drafted,
            rates,
            100 * tally.acceptance_rate,  # every draft has at least one token, so drafted > 0
            varied,
        )


def _rates(rates: list[float]) -> str:
    return ", ".join("-" if math.isnan(r) else f"{r:.3f}" for r in rates)
