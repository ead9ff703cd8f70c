"""Whether proposing pays (with ``--enable-adaptive-verification``): adaptive verification chooses what to
verify once the drafts exist, but drafting itself costs a drafter forward every step; where that costs more
than the accepted drafts bring (long contexts, big batches on a slow device), the engine decodes without
proposing.

The choice is measured, not modelled: the engine's own tokens per second over decode steps that both verified
drafts and proposed new ones (speculating) or did neither (plain). It runs one mode, keeping an exponential
moving average of that mode's rate, and in windows of EXPLORE_STEPS steps runs the other one (measuring all
but its first SETTLE_STEPS); at a window's end it switches when the window measured the other mode
SWITCH_MARGIN faster than the mode in use runs now. A window whose first EARLY_END_STEPS measured steps ran
the other mode at under half the rate ends there: the answer is clear, and each more step costs double.
Both rates fall as contexts grow, so only rates measured side by side are compared, never a rate from long
ago (which would always look faster). The first window comes FIRST_WINDOW steps in; after a window that kept
the mode the next comes twice as far on, and far enough that windows cost at most EXPLORE_BUDGET of the time
(a window of n steps at a rate r' against r costs n * (r / r' - 1) steps more: at batch 16 on a 2-core CPU,
where speculating ran at a quarter of plain decoding's rate, windows every 32 steps cost ~15 % of the steps),
up to MAX_EXPLORE_EVERY steps apart; EXPLORE_EVERY after one that switched. What pays depends on the batch,
so each batch bucket (1, 2-3, 4-7, 8-15, ...) keeps its own mode and window spacing (:class:`DraftingPolicy`):
a server whose load moves between 1 and 16 requests takes up the mode each load had. A step that switches
mode (it verifies drafts but proposes none, or the reverse) and a step with prefill in it measure neither
mode. Drafts never proposed are no drafts: no counter moves (docs/design.md, counter semantics).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

# Windows of EXPLORE_STEPS steps run the mode not in use; their first SETTLE_STEPS are not measured (the
# first switches; in a server the next ones still pay for the other mode's work, e.g. a frontend streaming
# the tokens of the speculating steps before them: plain steps measured right after speculating ones ran
# ~30 % slow at batch 16, and speculating looked faster than plain decoding where it was 22 % slower).
EXPLORE_STEPS = 8
SETTLE_STEPS = 3
EARLY_END_STEPS = 2  # measured steps after which a window of a mode at under half the rate ends
FIRST_WINDOW = 8  # speculating is measured first, plain decoding in the first window
EXPLORE_EVERY = 32
MAX_EXPLORE_EVERY = 512
EXPLORE_BUDGET = 0.05  # the share of the time windows of a slower mode may cost, at most
# The mode in use gives way only to one measured this much faster: rates are noisy, and every switch costs a
# step that measures neither mode (near break-even, modes within a few percent flipped every few steps).
SWITCH_MARGIN = 0.05
# How much one measured step moves the rate of the mode in use at least (an exponential moving average; its
# first 1 / RATE_EMA steps in the mode are averaged evenly, so that one odd step does not set it for long).
RATE_EMA = 0.1


@dataclass(frozen=True)
class BatchMode:
    """What the policy learned for one batch bucket (batches of the same bit length: 1, 2-3, 4-7, 8-15, ...):
    whether it speculates there, and how far apart its windows had grown."""

    speculating: bool
    gap: int


def bucket_of(batch: int) -> int:
    """The bucket of a batch of ``batch`` requests: its bit length (1, 2-3, 4-7, 8-15, ... share one)."""
    return max(batch, 1).bit_length()


@dataclass
class DraftingPolicy:
    """The mode the engine runs (proposing or not) at the batch it runs, its measured rate, and the exploring
    windows. What pays depends on the batch (a batch of 16 can lose on a device where one request gains), so
    each batch bucket keeps its mode: the steps at one bucket run and measure its mode from the moment the
    batch enters it (the rate measured afresh: one from a stint long ago would be stale). A bucket never
    tested by a window starts plainly where the nearest tested bucket below it decodes plainly (speculating
    pays less as batches grow), else speculating, and measures the other mode FIRST_WINDOW steps in; a tested
    one starts in its mode, its first window as far in as its windows had grown apart (a batch that moves
    back and forth between buckets does not pay a window at each move)."""

    speculating: bool = True  # the mode in use outside windows
    rate: float | None = None  # tokens per second of the mode in use (its moving average), at this bucket
    count: int = 0  # steps measured in the mode in use since it began
    explored: list[float] = field(default_factory=list)  # the current window's measured rates
    steps: int = 0  # steps chosen since the batch entered its bucket
    window: int = FIRST_WINDOW  # the step the next (or current) window starts at
    gap: int = EXPLORE_EVERY  # steps from the current window's start to the next one's
    bucket: int | None = None  # the batch bucket of the steps being chosen
    tested: bool = False  # whether a window has tested the bucket's mode (else it is only a prior)
    learned: dict[int, BatchMode] = field(default_factory=dict)  # other buckets' modes, as they were left

    @property
    def exploring(self) -> bool:
        """Whether the current step is in a window (runs the mode not in use)."""
        return self.window <= self.steps < self.window + EXPLORE_STEPS

    def choose(self, batch: int = 1) -> bool:
        """Whether the next step, of ``batch`` requests, proposes drafts (the last step's timing has been
        observed already)."""
        bucket = bucket_of(batch)
        if bucket != self.bucket:
            self._enter(bucket)
        self.steps += 1
        if self.steps == self.window + EXPLORE_STEPS or (self.exploring and self._clearly_slower()):
            self._end_window()
        return self.speculating != self.exploring

    def observe(self, proposed: bool, verified: bool, tokens: int, seconds: float) -> None:
        """A decode step (no prefill) that ``proposed`` drafts and ``verified`` earlier ones gave ``tokens``
        output tokens in ``seconds``: the rate of its mode, when it ran in one."""
        if proposed != verified or tokens <= 0 or seconds <= 0:
            return
        rate = tokens / seconds
        if proposed != self.speculating:  # a window's step (this is the step before the next choice)
            if self.steps >= self.window + SETTLE_STEPS:
                self.explored.append(rate)
            return
        self.count += 1
        old = self.rate or 0.0
        self.rate = old + max(RATE_EMA, 1 / self.count) * (rate - old)

    def _enter(self, bucket: int) -> None:
        """The batch moved to ``bucket``: keep the last bucket's mode, take up this one's (or its
        neighbours' for a bucket never seen), and measure afresh."""
        if self.bucket is not None and self.tested:
            self.learned[self.bucket] = BatchMode(self.speculating, self.gap)
        known = self.learned.get(bucket)
        self.tested = known is not None
        if known is not None:
            self.speculating, self.gap, self.window = known.speculating, known.gap, known.gap
        else:  # plain above the nearest bucket below when plain won there, else speculating
            below = [b for b in self.learned if b < bucket]
            self.speculating = not below or self.learned[max(below)].speculating
            self.gap, self.window = EXPLORE_EVERY, FIRST_WINDOW
        self.bucket, self.steps, self.rate, self.count, self.explored = bucket, 0, None, 0, []

    def _clearly_slower(self) -> bool:
        """Whether the window has measured enough steps of the other mode to know it runs at under half the
        rate of the mode in use."""
        measured = self.explored
        return (
            len(measured) >= EARLY_END_STEPS
            and self.rate is not None
            and sum(measured) / len(measured) < self.rate / 2
        )

    def _end_window(self) -> None:
        """Switch when the window measured the other mode clearly faster; place the next window."""
        explored = sum(self.explored) / len(self.explored) if self.explored else None
        self.tested |= explored is not None
        before = self.describe()
        switch = explored is not None and (self.rate is None or explored > self.rate * (1 + SWITCH_MARGIN))
        if switch:
            self.speculating = not self.speculating
            self.rate, self.count = explored, len(self.explored)
            self.gap = EXPLORE_EVERY
        else:  # the next window further off, the more so the more the other mode lost
            gap = 2 * self.gap
            if explored is not None and self.rate is not None:
                extra = (self.steps - self.window) * (self.rate / explored - 1)  # steps the window cost
                gap = max(gap, round(extra / EXPLORE_BUDGET))
            self.gap = min(gap, MAX_EXPLORE_EVERY)
        self.explored = []
        self.window += self.gap
        measured = "nothing measured" if explored is None else f"the other mode at {explored:.0f} tok/s"
        logger.info("drafting policy: %s; window: %s; now %s", before, measured, self.describe())

    def describe(self) -> str:
        mode = "speculating" if self.speculating else "plain"
        rate = "unmeasured" if self.rate is None else f"{self.rate:.0f} tok/s"
        batch = "" if self.bucket is None else f" at batches {2 ** (self.bucket - 1)}-{2**self.bucket - 1}"
        return f"{mode}{batch} at {rate}, next window at its step {self.window}"
