"""Whether proposing pays (with ``--enable-adaptive-verification``): adaptive verification chooses what to
verify once the drafts exist, but drafting itself costs a drafter forward every step; where that costs more
than the accepted drafts bring (long contexts, big batches on a slow device), the engine decodes without
proposing.

The choice is measured, not modelled: the engine's own tokens per second over the decode steps that both
verified drafts and proposed new ones (speculating) and over those that did neither (plain), each an
exponential moving average. It runs the faster mode, and in windows of EXPLORE_STEPS steps the other one, so
that both estimates follow the batch and the context as they change: the first window EXPLORE_EVERY steps
in, each next one twice as far after a window that left the faster mode as it was (up to MAX_EXPLORE_EVERY
steps apart: a window costs what the slower mode loses, ~15 % of the steps between windows 32 apart at
batch 16 on a 2-core CPU), EXPLORE_EVERY again after one that changed it. A step that
switches mode (it verifies drafts but proposes none, or the reverse) and a step with prefill in it measure
neither mode and are not counted. Until both modes are measured it speculates first, then decodes plainly.
Drafts never proposed are no drafts: no counter moves (docs/design.md, counter semantics).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Windows of EXPLORE_STEPS steps run the mode not in use (the first switches, the rest count): the first
# EXPLORE_EVERY steps in, then each twice as far after the last while they confirm the faster mode.
EXPLORE_EVERY = 32
MAX_EXPLORE_EVERY = 512
EXPLORE_STEPS = 3
# The mode in use gives way only to one measured this much faster: the rates move with the context and with
# noise, and every switch costs a step that measures neither mode (near break-even, at batch 16 here, modes
# within a few percent of each other flipped every few steps).
SWITCH_MARGIN = 0.05
# How much one measured step moves its mode's rate at least (an exponential moving average; the first
# 1 / RATE_EMA steps of a mode are averaged evenly, so that one odd first step does not set it for long).
RATE_EMA = 0.1


@dataclass
class DraftingPolicy:
    """The engine's measured tokens per second with and without proposing, and the mode of the next step."""

    rates: dict[bool, float | None] = field(default_factory=lambda: {True: None, False: None})
    counts: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})  # steps measured per mode
    steps: int = 0  # steps chosen so far
    window: int = EXPLORE_EVERY  # the step the next (or current) exploring window starts at
    gap: int = EXPLORE_EVERY  # steps from the current window's start to the next one's
    faster_before: bool | None = None  # the faster mode as the current window began
    faster: bool | None = None  # the mode run outside windows: the faster one, by SWITCH_MARGIN to change

    def choose(self) -> bool:
        """Whether the next step proposes drafts."""
        self.steps += 1
        speculating, plain = self.rates[True], self.rates[False]
        if speculating is None or plain is None:
            return speculating is None  # measure speculating first, then plain decoding
        kept, other = (speculating, plain) if self.faster else (plain, speculating)
        if self.faster is None or other > kept * (1 + SWITCH_MARGIN):
            self.faster = speculating >= plain
        faster = self.faster
        if self.steps == self.window:
            self.faster_before = faster
        if self.steps >= self.window + EXPLORE_STEPS:  # the window is over: the next one
            confirmed = faster == self.faster_before
            self.gap = min(2 * self.gap, MAX_EXPLORE_EVERY) if confirmed else EXPLORE_EVERY
            self.window += self.gap
        exploring = self.window <= self.steps < self.window + EXPLORE_STEPS
        return faster != exploring

    def observe(self, proposed: bool, verified: bool, tokens: int, seconds: float) -> None:
        """A decode step (no prefill) that ``proposed`` drafts and ``verified`` earlier ones gave ``tokens``
        output tokens in ``seconds``: it moves the rate of its mode, when it is in one."""
        if proposed != verified or tokens <= 0 or seconds <= 0:
            return
        self.counts[proposed] += 1
        rate, old = tokens / seconds, self.rates[proposed] or 0.0
        self.rates[proposed] = old + max(RATE_EMA, 1 / self.counts[proposed]) * (rate - old)

    def describe(self) -> str:
        def text(rate: float | None) -> str:
            return "unmeasured" if rate is None else f"{rate:.0f} tok/s"

        return f"speculating {text(self.rates[True])}, plain {text(self.rates[False])}"
