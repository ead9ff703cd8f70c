"""Whether proposing pays (with ``--enable-adaptive-verification``): adaptive verification chooses what to
verify once the drafts exist, but drafting itself costs a drafter forward every step; where that costs more
than the accepted drafts bring (long contexts, big batches on a slow device), the engine decodes without
proposing.

The choice is measured, not modelled: the engine's own tokens per second over the decode steps that both
verified drafts and proposed new ones (speculating) and over those that did neither (plain), each an
exponential moving average. It runs the faster mode, and every EXPLORE_EVERY steps the other one for
EXPLORE_STEPS steps, so that both estimates follow the batch and the context as they change. A step that
switches mode (it verifies drafts but proposes none, or the reverse) and a step with prefill in it measure
neither mode and are not counted. Until both modes are measured it speculates first, then decodes plainly.
Drafts never proposed are no drafts: no counter moves (docs/design.md, counter semantics).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Every this-many steps the mode not in use runs for EXPLORE_STEPS steps (the first switches, the rest count).
EXPLORE_EVERY = 32
EXPLORE_STEPS = 3
# How much one measured step moves its mode's rate at least (an exponential moving average; the first
# 1 / RATE_EMA steps of a mode are averaged evenly, so that one odd first step does not set it for long).
RATE_EMA = 0.1


@dataclass
class DraftingPolicy:
    """The engine's measured tokens per second with and without proposing, and the mode of the next step."""

    rates: dict[bool, float | None] = field(default_factory=lambda: {True: None, False: None})
    counts: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})  # steps measured per mode
    steps: int = 0  # steps chosen so far

    def choose(self) -> bool:
        """Whether the next step proposes drafts."""
        self.steps += 1
        speculating, plain = self.rates[True], self.rates[False]
        if speculating is None or plain is None:
            return speculating is None  # measure speculating first, then plain decoding
        exploring = self.steps % EXPLORE_EVERY < EXPLORE_STEPS
        return (speculating >= plain) != exploring

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
