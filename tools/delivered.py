"""Which spec-log lines a frontend counted: the ``counted_seqs`` of its ``GET /admin/engines``.

Each spec-log line names the seq of the first engine message whose snapshot holds its draft; the frontend
reports, per engine incarnation, the seqs whose snapshots it counted into ``/metrics``
(:mod:`openinfer.frontend.metrics.spec_decode.counted_seqs`). A line is then exactly one of :class:`Fate`.
"""

from __future__ import annotations

import enum
import json
import urllib.request
from dataclasses import dataclass

from openinfer.protocol.spec_log import SpecLogLine


class Fate(enum.Enum):
    """What became of one spec-log line at this frontend."""

    COUNTED = "counted"  # a snapshot holding it was counted into /metrics: it must be there
    # no snapshot holding it reached the frontend (its engine died first, or it never saw the incarnation)
    UNSENT = "unsent"
    EARLIER = (
        "earlier"  # held by the snapshot the frontend first saw (counted by an earlier frontend, if any)
    )


@dataclass(frozen=True)
class CountedRange:
    """Lines of ``incarnation`` with ``after_seq < seq <= through_seq`` are in /metrics (None: from zero)."""

    after_seq: int | None
    through_seq: int


@dataclass(frozen=True)
class Delivered:
    """The counted ranges, by (engine index, incarnation as 16 hex digits)."""

    ranges: dict[tuple[int, str], list[CountedRange]]

    @classmethod
    def from_json(cls, body: object) -> Delivered:
        """Parse ``/admin/engines``'s JSON; ``ValueError`` saying what is missing when it is not that."""
        try:
            counted = body["counted_seqs"]  # type: ignore[index]
            ranges: dict[tuple[int, str], list[CountedRange]] = {}
            for index, runs in counted.items():
                for run in runs:
                    key = (int(index), str(run["incarnation"]))
                    after = run["after_seq"]
                    counted_range = CountedRange(
                        None if after is None else int(after), int(run["through_seq"])
                    )
                    ranges.setdefault(key, []).append(counted_range)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"no counted_seqs by engine index ({type(e).__name__}: {e}); is it a frontend's "
                             "/admin/engines of this release?") from None  # fmt: skip
        return cls(ranges)

    def fate(self, line: SpecLogLine) -> Fate:
        """Where this draft is: in /metrics, in an unsent tail, or before what the frontend counted."""
        if line.seq is None:  # a release that did not write seqs: as before, every line counts
            return Fate.COUNTED
        runs = self.ranges.get((line.engine_index, line.incarnation), [])
        if any((r.after_seq is None or r.after_seq < line.seq) and line.seq <= r.through_seq for r in runs):
            return Fate.COUNTED
        if any(line.seq <= r.through_seq for r in runs):
            return Fate.EARLIER
        return Fate.UNSENT


def fetch_delivered(url: str, api_key: str | None, timeout: float = 10.0) -> Delivered:
    """GET a frontend's ``/admin/engines``; ``OSError`` when it cannot, ``ValueError`` when it is not one."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
        try:
            body = json.load(response)
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON: {e}") from None
    return Delivered.from_json(body)
