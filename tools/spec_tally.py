"""Acceptance tallies from the two sources the verification compares: engine spec logs and ``/metrics``.

Importable on their own (the benchmark reuses them): :func:`read_spec_logs` / :func:`tally_spec_log`,
:func:`scrape_metrics` / :func:`tally_metrics`, and :class:`AcceptanceTally` with its bins and derived rates.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from openinfer.frontend.metrics.spec_decode.acceptance_tally import AcceptanceTally, total
from openinfer.protocol.spec_log import SpecLogLine, parse_spec_log_line
from openinfer.tools.delivered import Delivered, Fate

# AcceptanceTally and total are this module's API too (the benchmarks and the checkers import them here).
__all__ = ["AcceptanceTally", "SpecLogTally", "read_spec_logs", "scrape_metrics", "tally_metrics", "total"]

# Sample names as exposed, with the ``_total`` suffix. Matching sample names (not family names) reads the
# same whether or not the exposition declares the type: the parser strips ``_total`` from a counter
# family's name, never from its samples'; the ``_created`` samples prometheus_client adds are skipped.
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
ACCEPTED_LENGTH = "openinfer:spec_decode_accepted_length_total"
DRAFT_TOKENS_PER_POS = "openinfer:spec_decode_num_draft_tokens_per_pos_total"
UNVERIFIED_TOKENS = "openinfer:spec_decode_num_unverified_draft_tokens_total"
REACHED_PER_POS = "openinfer:spec_decode_num_reached_per_pos_total"
CONFIDENCE_MICROS_PER_POS = "openinfer:spec_decode_confidence_micros_per_pos_total"
SPEC_DECODE_SAMPLES = (
    DRAFTS,
    DRAFT_TOKENS,
    ACCEPTED_TOKENS,
    ACCEPTED_PER_POS,
    ACCEPTED_LENGTH,
    DRAFT_TOKENS_PER_POS,
    UNVERIFIED_TOKENS,
    REACHED_PER_POS,
    CONFIDENCE_MICROS_PER_POS,
)


# ---- the engines' spec logs ----


@dataclass
class SpecLogTally:
    """Spec-log lines tallied per engine index, and the lines that could not be read. A line is a round: a
    draft, or a proposal the scheduler verified none of (only its unverified tokens count).

    With what a frontend counted (:class:`~openinfer.tools.delivered.Delivered`), ``engines`` tallies only the
    lines it counted; an unsent tail (lines whose snapshot never reached it) and the lines before what it
    counted are tallied apart, by engine index.

    A line an engine was writing when it was killed is cut short: a line that is not even JSON, right before
    another incarnation's lines (a restarted engine ends a cut line before writing) or last in a file without
    its newline, is in ``cut``, not ``malformed``; it was the last of its incarnation, which no snapshot holds.
    """

    engines: dict[int, AcceptanceTally] = field(default_factory=dict)
    malformed: list[str] = field(default_factory=list)  # "FILE:LINE: why"
    unsent: dict[int, AcceptanceTally] = field(default_factory=dict)
    earlier: dict[int, AcceptanceTally] = field(default_factory=dict)
    cut: list[str] = field(default_factory=list)  # "FILE:LINE: why"

    def add_line(
        self,
        line: str | bytes,
        where: str,
        since: float | None = None,
        until: float | None = None,
        delivered: Delivered | None = None,
    ) -> SpecLogLine | None:
        """Count one line (blank lines are skipped, and rounds outside unix times [since, until] when given);
        the round read, None when there is none.

        A line that is not a possible round is recorded in ``malformed``, with ``where`` it was.
        """
        if not line.strip():
            return None
        try:
            draft = parse_spec_log_line(line)
        except ValueError as e:
            self.malformed.append(f"{where}: {e}")
            return None
        if (since is not None and draft.time < since) or (until is not None and draft.time > until):
            return draft
        fate = Fate.COUNTED if delivered is None else delivered.fate(draft)
        tallies = {Fate.COUNTED: self.engines, Fate.UNSENT: self.unsent, Fate.EARLIER: self.earlier}[fate]
        tally = tallies.setdefault(draft.engine_index, AcceptanceTally())
        tally.add_round(draft)
        return draft


def read_spec_logs(
    paths: Iterable[Path],
    since: float | None = None,
    until: float | None = None,
    delivered: Delivered | None = None,
) -> SpecLogTally:
    """Tally every line of these files (only drafts timed within unix times [since, until] when given; split
    by what a frontend counted when ``delivered`` is given).

    Raises ``OSError`` when a file cannot be read.
    """
    result = SpecLogTally()
    for path in paths:
        incarnation: str | None = None  # of the last readable line
        cut: int | None = None  # the last line's place in result.malformed when it is not even JSON
        last = b""
        with path.open("rb") as file:
            for number, line in enumerate(file, start=1):
                num_malformed = len(result.malformed)
                draft = result.add_line(line, f"{path}:{number}", since, until, delivered)
                if len(result.malformed) > num_malformed:
                    cut = num_malformed if not _is_json(line) else None
                elif draft is not None:
                    if cut is not None and draft.incarnation != incarnation:
                        result.cut.append(result.malformed.pop(cut))
                    cut, incarnation = None, draft.incarnation
                last = line
        if cut is not None and not last.endswith(b"\n"):
            result.cut.append(result.malformed.pop(cut))
    return result


def _is_json(line: bytes) -> bool:
    try:
        msgspec.json.decode(line)
    except msgspec.DecodeError:
        return False
    return True


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
            if sample.name not in SPEC_DECODE_SAMPLES:
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
                tally.grow(num_pos=position + 1)
                tally.per_pos[position] += value
                tally.num_spec_tokens = max(tally.num_spec_tokens, position + 1)
            elif sample.name == DRAFT_TOKENS_PER_POS:
                position = _index_label(sample.name, sample.labels, "position")
                tally.grow(num_draft_pos=position + 1)
                tally.draft_per_pos[position] += value
            elif sample.name == UNVERIFIED_TOKENS:
                tally.num_unverified_tokens += value
            elif sample.name in (REACHED_PER_POS, CONFIDENCE_MICROS_PER_POS):
                position = _index_label(sample.name, sample.labels, "position")
                tally.grow(num_reached_pos=position + 1)
                bins = (
                    tally.reached_per_pos
                    if sample.name == REACHED_PER_POS
                    else tally.confidence_micros_per_pos
                )
                bins[position] += value
            else:
                accepted = _index_label(sample.name, sample.labels, "accepted")
                tally.grow(num_hist=accepted + 1)
                tally.hist[accepted] += value
    return engines


def _index_label(name: str, labels: dict[str, str], label: str) -> int:
    value = labels.get(label, "")
    if not value.isdigit():
        raise ValueError(f"{name} has {label} label {value!r}, not a non-negative integer")
    return int(value)
