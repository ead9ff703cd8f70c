"""Whether proposing pays (with ``--enable-adaptive-verification``): adaptive verification chooses what to
verify once the drafts exist, but drafting itself costs a drafter forward every step; where that costs more
than the accepted drafts bring (long contexts, big batches on a slow device), the engine decodes without
proposing.

The choice is measured, not modelled: the engine's own tokens per second over decode steps that both verified
drafts and proposed new ones (speculating) or did neither (plain). It runs one mode, keeping an exponential
moving average of that mode's rate, and in windows of EXPLORE_STEPS steps runs the other one; at a window's
end it switches when the window measured the other mode SWITCH_MARGIN faster than the mode in use runs now.
Both rates fall as contexts grow, so only rates measured side by side are compared, never a rate from long
ago (which would always look faster). The first window comes FIRST_WINDOW steps in; each next one twice as
far after a window that kept the mode (up to MAX_EXPLORE_EVERY steps apart: at batch 16 on a 2-core CPU,
where speculating loses, a window every 32 steps cost ~15 % of the steps between), EXPLORE_EVERY after one
that switched. A step that switches mode (it verifies drafts but proposes none, or the reverse) and a step
with prefill in it measure neither mode. Drafts never proposed are no drafts: no counter moves
(docs/design.md, counter semantics).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Windows of EXPLORE_STEPS steps run the mode not in use (the first switches, the rest are measured).
EXPLORE_STEPS = 4
FIRST_WINDOW = 16  # speculating is measured first, plain decoding in the first window
EXPLORE_EVERY = 32
MAX_EXPLORE_EVERY = 512
# The mode in use gives way only to one measured this much faster: rates are noisy, and every switch costs a
# step that measures neither mode (near break-even, modes within a few percent flipped every few steps).
SWITCH_MARGIN = 0.05
# How much one measured step moves the rate of the mode in use at least (an exponential moving average; its
# first 1 / RATE_EMA steps in the mode are averaged evenly, so that one odd step does not set it for long).
RATE_EMA = 0.1


@dataclass
class DraftingPolicy:
    """The mode the engine runs (proposing or not), its measured rate, and the exploring windows."""

    speculating: bool = True  # the mode in use outside windows
    rate: float | None = None  # tokens per second of the mode in use (its moving average)
    count: int = 0  # steps measured in the mode in use since it began
    explored: list[float] = field(default_factory=list)  # the current window's measured rates
    steps: int = 0  # steps chosen so far
    window: int = FIRST_WINDOW  # the step the next (or current) window starts at
    gap: int = EXPLORE_EVERY  # steps from the current window's start to the next one's

    @property
    def exploring(self) -> bool:
        """Whether the current step is in a window (runs the mode not in use)."""
        return self.window <= self.steps < self.window + EXPLORE_STEPS

    def choose(self) -> bool:
        """Whether the next step proposes drafts (the last step's timing has been observed already)."""
        self.steps += 1
        if self.steps == self.window + EXPLORE_STEPS:
            self._end_window()
        return self.speculating != self.exploring

    def observe(self, proposed: bool, verified: bool, tokens: int, seconds: float) -> None:
        """A decode step (no prefill) that ``proposed`` drafts and ``verified`` earlier ones gave ``tokens``
        output tokens in ``seconds``: the rate of its mode, when it ran in one."""
        if proposed != verified or tokens <= 0 or seconds <= 0:
            return
        rate = tokens / seconds
        if proposed != self.speculating:
            self.explored.append(rate)
            return
        self.count += 1
        old = self.rate or 0.0
        self.rate = old + max(RATE_EMA, 1 / self.count) * (rate - old)

    def _end_window(self) -> None:
        """Switch when the window measured the other mode clearly faster; place the next window."""
        explored = sum(self.explored) / len(self.explored) if self.explored else None
        if explored is not None and (self.rate is None or explored > self.rate * (1 + SWITCH_MARGIN)):
            self.speculating = not self.speculating
            self.rate, self.count = explored, len(self.explored)
            self.gap = EXPLORE_EVERY
        else:
            self.gap = min(2 * self.gap, MAX_EXPLORE_EVERY)
        self.explored = []
        self.window += self.gap

    def describe(self) -> str:
        mode = "speculating" if self.speculating else "plain"
        rate = "unmeasured" if self.rate is None else f"{self.rate:.0f} tok/s"
        return f"{mode} at {rate}, next window at step {self.window}"
