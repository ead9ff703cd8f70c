"""Which spec-log lines a frontend's ``/metrics`` holds: per engine incarnation, the seqs it counted over.

Every spec-log line names ``seq``: the engine's first message whose load snapshot holds that draft. The
frontend publishes what each snapshot it takes adds (docs/design.md, frontend diffing), so of one incarnation,
``/metrics`` holds exactly the lines with ``after_seq < seq <= through_seq`` of one of its ranges:

- ``through_seq``: the latest message of the incarnation whose snapshot was taken (its counters published);
- ``after_seq``: None when the incarnation was counted from zero (a new incarnation of an index this
  frontend, or the one whose ``--state-dir`` it continues, had seen); the seq of its first snapshot when
  that one was a first sight (a baseline: what it held was exported by an earlier frontend, or is zero).

A line above every ``through_seq`` of its incarnation is an unsent tail: its engine died (or the frontend
did, without ``--state-dir``) before a snapshot holding it was taken. ``GET /admin/engines`` shows the ranges
(``counted_seqs``) and ``openinfer-verify-log --engines-url`` reads them; ``--state-dir`` saves them with the
totals, so a restarted frontend's ranges describe its continued series.
"""

from __future__ import annotations

import msgspec

# Ranges kept per engine index, the newest ones (an index that restarted more often forgets its oldest).
MAX_RANGES_PER_ENGINE = 64


class CountedSeqs(msgspec.Struct, frozen=True, array_like=True):
    """One run of snapshots of an incarnation that this frontend counted, one after another."""

    incarnation: int
    after_seq: int | None  # lines at or below it are not in /metrics; None: counted from zero
    through_seq: int  # lines at or below it (and above after_seq) are


class CountedSeqsLog:
    """The counted ranges of every engine index, oldest first."""

    def __init__(self) -> None:
        self._by_index: dict[int, list[CountedSeqs]] = {}

    def observe(self, engine_index: int, incarnation: int, seq: int, first_sight: bool) -> None:
        """The snapshot of message ``seq`` was taken; ``first_sight``: it became the index's baseline."""
        ranges = self._by_index.setdefault(engine_index, [])
        if ranges and ranges[-1].incarnation == incarnation and not first_sight:
            ranges[-1] = CountedSeqs(incarnation, ranges[-1].after_seq, seq)
            return
        ranges.append(CountedSeqs(incarnation, seq if first_sight else None, seq))
        del ranges[:-MAX_RANGES_PER_ENGINE]

    def saved(self) -> dict[int, list[CountedSeqs]]:
        """Every index's ranges (copies), for ``--state-dir``."""
        return {index: list(ranges) for index, ranges in self._by_index.items()}

    def restore(self, saved: dict[int, list[CountedSeqs]]) -> None:
        """Take the ranges saved with the totals they describe."""
        self._by_index = {index: list(ranges[-MAX_RANGES_PER_ENGINE:]) for index, ranges in saved.items()}

    def to_json(self) -> dict[str, list[dict[str, object]]]:
        """By engine index: ``{"incarnation": 16 hex digits (as in the spec log), "after_seq", "through_seq"}``."""
        return counted_json(self._by_index)


def counted_json(by_index: dict[int, list[CountedSeqs]]) -> dict[str, list[dict[str, object]]]:
    """Ranges by engine index as ``/admin/engines`` shows them (:meth:`CountedSeqsLog.to_json`)."""
    return {
        str(index): [
            {"incarnation": f"{r.incarnation:016x}", "after_seq": r.after_seq, "through_seq": r.through_seq}
            for r in ranges
        ]
        for index, ranges in sorted(by_index.items())
    }
