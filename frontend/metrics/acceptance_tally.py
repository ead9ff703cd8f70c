"""The acceptance tally: drafts counted bin by bin, summed over engines, with its derived rates.

One tally for every reader of acceptance: the SpecDecoding log line, per-request metrics, the verify-log
checker and the benchmark (:mod:`openinfer.tools.spec_tally` reads spec logs and ``/metrics`` into it). A
draft is only ever counted by :meth:`SpecDecodeCounters.observe_draft`; this adds such counters up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from openinfer.protocol import SpecDecodeCounters


@dataclass
class AcceptanceTally:
    """Drafts counted bin by bin, as the engine counters count them (DESIGN.md, counter semantics).

    ``per_pos[i]``: drafts whose token at position i was accepted (a prefix tally); ``hist[n]``: drafts with
    n tokens accepted. Both grow as needed; missing bins are 0. ``num_spec_tokens`` is the largest K seen.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    per_pos: list[int] = field(default_factory=list)
    hist: list[int] = field(default_factory=list)
    num_spec_tokens: int = 0

    def add_draft(self, num_spec_tokens: int, num_draft_tokens: int, num_accepted: int) -> None:
        """Count one draft of ``num_draft_tokens`` tokens, ``num_accepted`` of them accepted: through
        :meth:`SpecDecodeCounters.observe_draft`, the one place a draft is tallied (``ValueError`` if
        impossible)."""
        draft = SpecDecodeCounters.zero(num_spec_tokens)
        draft.observe_draft(num_draft_tokens, num_accepted)
        self.add_counters(draft)

    def add_counters(self, counters: SpecDecodeCounters) -> None:
        """Add counters of one K (an engine's delta over an interval, or one draft)."""
        self.add(
            AcceptanceTally(
                counters.num_drafts,
                counters.num_draft_tokens,
                counters.num_accepted_tokens,
                counters.num_accepted_tokens_per_pos,
                counters.accepted_length_hist,
                counters.num_spec_tokens,
            )
        )

    def grow(self, num_pos: int = 0, num_hist: int = 0) -> None:
        """At least ``num_pos`` position bins and ``num_hist`` histogram bins (new ones 0)."""
        _grow(self.per_pos, num_pos)
        _grow(self.hist, num_hist)

    def add(self, other: AcceptanceTally) -> None:
        """Add another tally (another engine) to this one."""
        self.num_spec_tokens = max(self.num_spec_tokens, other.num_spec_tokens)
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        _add_bins(self.per_pos, other.per_pos)
        _add_bins(self.hist, other.hist)

    def minus(self, base: AcceptanceTally) -> AcceptanceTally:
        """Bin-wise ``self - base`` (two scrapes of one server: the counts in between)."""
        return AcceptanceTally(
            self.num_drafts - base.num_drafts,
            self.num_draft_tokens - base.num_draft_tokens,
            self.num_accepted_tokens - base.num_accepted_tokens,
            _bin_minus(self.per_pos, base.per_pos),
            _bin_minus(self.hist, base.hist),
            max(self.num_spec_tokens, base.num_spec_tokens),
        )

    def bins(self, num_pos: int = 0, num_hist: int = 0) -> dict[str, int]:
        """Every count by name, with at least ``num_pos`` position and ``num_hist`` histogram bins."""
        bins = {
            "drafts": self.num_drafts,
            "draft_tokens": self.num_draft_tokens,
            "accepted_tokens": self.num_accepted_tokens,
        }
        for i, count in enumerate(_padded(self.per_pos, max(num_pos, len(self.per_pos)))):
            bins[f"per_pos[{i}]"] = count
        for n, count in enumerate(_padded(self.hist, max(num_hist, len(self.hist)))):
            bins[f"hist[{n}]"] = count
        return bins

    # Derived values (NaN without drafts).

    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per draft."""
        return self.num_accepted_tokens / self.num_drafts if self.num_drafts else math.nan

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verify step: the accepted draft tokens plus the target's bonus token."""
        return 1 + self.mean_accepted

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / draft tokens."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else math.nan

    @property
    def zero_accept_rate(self) -> float:
        """Share of drafts with nothing accepted."""
        return _at(self.hist, 0) / self.num_drafts if self.num_drafts else math.nan

    @property
    def full_accept_rate(self) -> float:
        """Share of drafts with all K tokens accepted (K the largest seen)."""
        return _at(self.hist, self.num_spec_tokens) / self.num_drafts if self.num_drafts else math.nan

    def per_pos_rates(self) -> list[float]:
        """Per position: drafts with it accepted / drafts."""
        return [count / self.num_drafts if self.num_drafts else math.nan for count in self.per_pos]

    def to_json(self) -> dict[str, object]:
        return {
            "num_spec_tokens": self.num_spec_tokens,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_pos": list(self.per_pos),
            "accepted_length_hist": list(self.hist),
        }


def total(tallies: Iterable[AcceptanceTally]) -> AcceptanceTally:
    """The sum of several tallies (all engines)."""
    result = AcceptanceTally()
    for tally in tallies:
        result.add(tally)
    return result


def _add_bins(counts: list[int], more: list[int]) -> None:
    _grow(counts, len(more))
    for i, count in enumerate(more):
        counts[i] += count


def _grow(counts: list[int], size: int) -> None:
    if len(counts) < size:
        counts.extend([0] * (size - len(counts)))


def _bin_minus(counts: list[int], base: list[int]) -> list[int]:
    size = max(len(counts), len(base))
    return [a - b for a, b in zip(_padded(counts, size), _padded(base, size), strict=True)]


def _padded(counts: list[int], size: int) -> list[int]:
    return counts + [0] * (size - len(counts))


def _at(counts: list[int], index: int) -> int:
    return counts[index] if index < len(counts) else 0
