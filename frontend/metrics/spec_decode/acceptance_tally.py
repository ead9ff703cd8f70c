"""The acceptance tally: drafts counted bin by bin, summed over engines, with its derived rates.

One tally for every reader of acceptance: the SpecDecoding log line, per-request metrics, the verify-log
checker and the benchmark (:mod:`openinfer.tools.spec_tally` reads spec logs and ``/metrics`` into it). A
round is only ever counted by the ``observe_*`` calls of :class:`SpecDecodeCounters`; this adds such
counters up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from openinfer.protocol import SpecDecodeCounters
from openinfer.protocol.counters import CONFIDENCE_SCALE
from openinfer.protocol.spec_log import SpecLogLine


@dataclass
class AcceptanceTally:
    """Drafts counted bin by bin, as the engine counters count them (docs/design.md, counter semantics).

    ``per_pos[i]``: drafts whose token at position i was accepted (a prefix tally); ``hist[n]``: drafts with
    n tokens accepted; ``draft_per_pos[i]``: drafts whose token at position i was verified;
    ``reached_per_pos[i]``: drafts whose token at position i was verified with every token before it
    accepted; ``confidence_micros_per_pos[i]``: a confidence head's ratings of those tokens, summed in
    millionths. They grow as needed; missing bins are 0 (a source without them, vLLM's /metrics, leaves
    them empty). ``num_spec_tokens`` is the largest K seen.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    per_pos: list[int] = field(default_factory=list)
    hist: list[int] = field(default_factory=list)
    num_spec_tokens: int = 0
    draft_per_pos: list[int] = field(default_factory=list)
    num_unverified_tokens: int = 0  # proposed, never verified
    reached_per_pos: list[int] = field(default_factory=list)
    confidence_micros_per_pos: list[int] = field(default_factory=list)

    def add_round(self, line: SpecLogLine) -> None:
        """Count one spec-log round (a draft, or a proposal verified not at all): through the
        :class:`SpecDecodeCounters` ``observe_*`` call the engine made, the one place a round is tallied
        (``ValueError`` if impossible)."""
        counters = SpecDecodeCounters.zero(line.num_spec_tokens)
        line.observe_into(counters)
        self.add_counters(counters)

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
                counters.num_draft_tokens_per_pos,
                counters.num_unverified_draft_tokens,
                counters.num_reached_per_pos,
                counters.confidence_micros_per_pos,
            )
        )

    def grow(
        self, num_pos: int = 0, num_hist: int = 0, num_draft_pos: int = 0, num_reached_pos: int = 0
    ) -> None:
        """At least ``num_pos`` accepted, ``num_draft_pos`` verified and ``num_reached_pos`` reached (and
        confidence) position bins, and ``num_hist`` histogram bins (new ones 0)."""
        _grow(self.per_pos, num_pos)
        _grow(self.hist, num_hist)
        _grow(self.draft_per_pos, num_draft_pos)
        _grow(self.reached_per_pos, num_reached_pos)
        _grow(self.confidence_micros_per_pos, num_reached_pos)

    def add(self, other: AcceptanceTally) -> None:
        """Add another tally (another engine) to this one."""
        self.num_spec_tokens = max(self.num_spec_tokens, other.num_spec_tokens)
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        _add_bins(self.per_pos, other.per_pos)
        _add_bins(self.hist, other.hist)
        _add_bins(self.draft_per_pos, other.draft_per_pos)
        self.num_unverified_tokens += other.num_unverified_tokens
        _add_bins(self.reached_per_pos, other.reached_per_pos)
        _add_bins(self.confidence_micros_per_pos, other.confidence_micros_per_pos)

    def minus(self, base: AcceptanceTally) -> AcceptanceTally:
        """Bin-wise ``self - base`` (two scrapes of one server: the counts in between)."""
        return AcceptanceTally(
            self.num_drafts - base.num_drafts,
            self.num_draft_tokens - base.num_draft_tokens,
            self.num_accepted_tokens - base.num_accepted_tokens,
            _bin_minus(self.per_pos, base.per_pos),
            _bin_minus(self.hist, base.hist),
            max(self.num_spec_tokens, base.num_spec_tokens),
            _bin_minus(self.draft_per_pos, base.draft_per_pos),
            self.num_unverified_tokens - base.num_unverified_tokens,
            _bin_minus(self.reached_per_pos, base.reached_per_pos),
            _bin_minus(self.confidence_micros_per_pos, base.confidence_micros_per_pos),
        )

    def bins(self, num_pos: int = 0, num_hist: int = 0) -> dict[str, int]:
        """Every count by name, with at least ``num_pos`` bins of each per-position tally and ``num_hist``
        histogram bins."""
        bins = {
            "drafts": self.num_drafts,
            "draft_tokens": self.num_draft_tokens,
            "accepted_tokens": self.num_accepted_tokens,
            "unverified_tokens": self.num_unverified_tokens,
        }
        for i, count in enumerate(_padded(self.per_pos, max(num_pos, len(self.per_pos)))):
            bins[f"per_pos[{i}]"] = count
        for n, count in enumerate(_padded(self.hist, max(num_hist, len(self.hist)))):
            bins[f"hist[{n}]"] = count
        for i, count in enumerate(_padded(self.draft_per_pos, max(num_pos, len(self.draft_per_pos)))):
            bins[f"draft_per_pos[{i}]"] = count
        for i, count in enumerate(_padded(self.reached_per_pos, max(num_pos, len(self.reached_per_pos)))):
            bins[f"reached_per_pos[{i}]"] = count
        micros = self.confidence_micros_per_pos
        for i, count in enumerate(_padded(micros, max(num_pos, len(micros)))):
            bins[f"confidence_micros_per_pos[{i}]"] = count
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
        """Per position: drafts with it accepted / drafts (unconditional, vLLM's)."""
        return [count / self.num_drafts if self.num_drafts else math.nan for count in self.per_pos]

    def conditional_rates(self) -> list[float]:
        """Per position: drafts with it accepted / drafts with it verified (NaN where none was verified).
        With every draft verified whole at one K, the same as :meth:`per_pos_rates`; with variable verify
        lengths, what the drafter's token at that position is worth when it is checked."""
        accepted = _padded(self.per_pos, max(len(self.per_pos), len(self.draft_per_pos)))
        verified = _padded(self.draft_per_pos, len(accepted))
        return [a / v if v else math.nan for a, v in zip(accepted, verified, strict=True)]

    def reached_rates(self) -> list[float]:
        """Per position: drafts with it accepted / drafts that reached it (verified, every token before it
        accepted): the measured conditional acceptance a confidence head estimates (NaN where none
        reached)."""
        size = max(len(self.per_pos), len(self.reached_per_pos))
        accepted, reached = _padded(self.per_pos, size), _padded(self.reached_per_pos, size)
        return [a / r if r else math.nan for a, r in zip(accepted, reached, strict=True)]

    def mean_confidences(self) -> list[float]:
        """Per position: the confidence head's mean rating over the drafts that reached it (NaN where none
        reached; 0 from a drafter without a confidence head). Beside :meth:`reached_rates`: its calibration."""
        size = max(len(self.confidence_micros_per_pos), len(self.reached_per_pos))
        micros, reached = _padded(self.confidence_micros_per_pos, size), _padded(self.reached_per_pos, size)
        return [m / CONFIDENCE_SCALE / r if r else math.nan for m, r in zip(micros, reached, strict=True)]

    def to_json(self) -> dict[str, object]:
        return {
            "num_spec_tokens": self.num_spec_tokens,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_pos": list(self.per_pos),
            "accepted_length_hist": list(self.hist),
            "draft_tokens_per_pos": list(self.draft_per_pos),
            "num_unverified_draft_tokens": self.num_unverified_tokens,
            "reached_per_pos": list(self.reached_per_pos),
            "confidence_micros_per_pos": list(self.confidence_micros_per_pos),
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
