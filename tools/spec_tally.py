"""Acceptance tallies from the two sources the verification compares: engine spec logs and ``/metrics``.

Importable on their own (the benchmark reuses them): :func:`read_spec_logs` / :func:`tally_spec_log`,
:func:`scrape_metrics` / :func:`tally_metrics`, and :class:`AcceptanceTally` with its bins and derived rates.
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from openinfer.protocol.spec_log import parse_spec_log_line

# Sample names as exposed, with the ``_total`` suffix. Matching sample names (not family names) reads the
# same whether or not the exposition declares the type: the parser strips ``_total`` from a counter
# family's name, never from its samples'; the ``_created`` samples prometheus_client adds are skipped.
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
ACCEPTED_LENGTH = "openinfer:spec_decode_accepted_length_total"


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
        """Count one draft of ``num_draft_tokens`` tokens, ``num_accepted`` of them accepted."""
        self.num_spec_tokens = max(self.num_spec_tokens, num_spec_tokens)
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        _grow(self.per_pos, num_spec_tokens)
        _grow(self.hist, num_spec_tokens + 1)
        for i in range(num_accepted):
            self.per_pos[i] += 1
        self.hist[num_accepted] += 1

    def add(self, other: AcceptanceTally) -> None:
        """Add another tally (another engine) to this one."""
        self.num_spec_tokens = max(self.num_spec_tokens, other.num_spec_tokens)
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for mine, theirs in ((self.per_pos, other.per_pos), (self.hist, other.hist)):
            _grow(mine, len(theirs))
            for i, count in enumerate(theirs):
                mine[i] += count

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


# ---- the engines' spec logs ----


@dataclass
class SpecLogTally:
    """Spec-log lines tallied per engine index, and the lines that could not be read."""

    engines: dict[int, AcceptanceTally] = field(default_factory=dict)
    malformed: list[str] = field(default_factory=list)  # "FILE:LINE: why"

    def add_line(
        self, line: str | bytes, where: str, since: float | None = None, until: float | None = None
    ) -> None:
        """Count one line (blank lines are skipped, and drafts outside unix times [since, until] when given).

        A line that is not a possible draft is recorded in ``malformed``, with ``where`` it was.
        """
        if not line.strip():
            return
        try:
            draft = parse_spec_log_line(line)
        except ValueError as e:
            self.malformed.append(f"{where}: {e}")
            return
        if (since is not None and draft.time < since) or (until is not None and draft.time > until):
            return
        tally = self.engines.setdefault(draft.engine_index, AcceptanceTally())
        tally.add_draft(draft.num_spec_tokens, draft.num_draft_tokens, draft.num_accepted)


def read_spec_logs(
    paths: Iterable[Path], since: float | None = None, until: float | None = None
) -> SpecLogTally:
    """Tally every line of these files (only drafts timed within unix times [since, until] when given).

    Raises ``OSError`` when a file cannot be read.
    """
    result = SpecLogTally()
    for path in paths:
        with path.open("rb") as file:
            for number, line in enumerate(file, start=1):
                result.add_line(line, f"{path}:{number}", since, until)
    return result


# ---- /metrics ----


def scrape_metrics(url: str, timeout: float = 10.0) -> str:
    """GET a Prometheus text exposition; raises ``OSError`` (``URLError``) when it cannot."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def tally_metrics(text: str) -> dict[int, AcceptanceTally]:
    """The spec-decode counters of a ``/metrics`` text, per engine label (summed over model names).

    Raises ``ValueError`` when the text does not parse or an engine label is not an index.
    """
    engines: dict[int, AcceptanceTally] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS, ACCEPTED_PER_POS, ACCEPTED_LENGTH):
                continue
            engine_label = sample.labels.get("engine", "")
            if not engine_label.isdigit():
                raise ValueError(f"{sample.name} has engine label {engine_label!r}, not an engine index")
            tally = engines.setdefault(int(engine_label), AcceptanceTally())
            value = round(sample.value)
            if sample.name == DRAFTS:
                tally.num_drafts += value
            elif sample.name == DRAFT_TOKENS:
                tally.num_draft_tokens += value
            elif sample.name == ACCEPTED_TOKENS:
                tally.num_accepted_tokens += value
            elif sample.name == ACCEPTED_PER_POS:
                position = _index_label(sample.name, sample.labels, "position")
                _grow(tally.per_pos, position + 1)
                tally.per_pos[position] += value
                tally.num_spec_tokens = max(tally.num_spec_tokens, position + 1)
            else:
                accepted = _index_label(sample.name, sample.labels, "accepted")
                _grow(tally.hist, accepted + 1)
                tally.hist[accepted] += value
    return engines


def _index_label(name: str, labels: dict[str, str], label: str) -> int:
    value = labels.get(label, "")
    if not value.isdigit():
        raise ValueError(f"{name} has {label} label {value!r}, not a non-negative integer")
    return int(value)


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
