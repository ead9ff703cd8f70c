"""An api server's view, and the checks another api server's view passes before a scrape shows it.

A view is what api server ``i`` of ``openinfer-serve --api-server-count N`` shows the others (its exposition
and counted seqs, :mod:`~openinfer.frontend.metrics.api_servers`). A peer's view is input from another
process: it comes from a socket or file in the peers folder, which only this user can write and whose peers
answer as this user (checked there), so a view that fails here is a bug, a file left by another release, or
a disk that lost a write, never to be trusted with a scrape. It is shown only when it decodes and everything
in it is a value an api server can export:

- at most :data:`MAX_VIEW_BYTES` (a view of 64 engines at K = 32 is about 1.4 MB);
- an exposition that parses, of counters, gauges and histograms only (all an api server exports);
- every sample finite, not negative and at most 2^53 (counts, seconds, ratios: past 2^53 a count is not even
  exact as a float, and no counter gets there);
- no ``openinfer:engine_up`` of an engine whose ``engine_up`` this api server exports: an engine has one
  metrics frontend, the one its hello said so to;
- counted seqs that can be: engine indices and seqs not negative, incarnations of 64 bits, ``after_seq`` at
  most ``through_seq``, at most :data:`MAX_RANGES_PER_ENGINE` ranges an engine.

What it cannot check is what a peer legitimately reports and this api server cannot know: the series of
engines it exports (an engine says who exports it to that frontend alone), or whether its counters went down
(a peer whose state file the operator moved away starts again from zero, as Prometheus expects of a restart).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from prometheus_client.metrics_core import Metric

from openinfer.frontend.metrics.exposition_sum import parse_exposition
from openinfer.frontend.metrics.spec_decode.counted_seqs import MAX_RANGES_PER_ENGINE, CountedSeqs

MAX_VIEW_BYTES = 8 << 20
MAX_SAMPLE = float(2**53)
_TYPES = frozenset({"counter", "gauge", "histogram"})


class ApiServerView(msgspec.Struct):
    """What one api server shows: its exposition, and by engine index the seqs its counters hold."""

    exposition: str
    counted_seqs: dict[int, list[CountedSeqs]]


class BadView(Exception):
    """A peer's view that no api server shows: the message says why."""


@dataclass(frozen=True)
class ParsedView:
    """A view with its exposition parsed: what a scrape sums."""

    families: list[Metric]
    counted_seqs: dict[int, list[CountedSeqs]]

    def exported_engines(self) -> set[str]:
        """The engine labels of its ``openinfer:engine_up`` series: the engines it is the metrics frontend of."""
        return {
            s.labels.get("engine", "")
            for family in self.families
            if family.name == "openinfer:engine_up"
            for s in family.samples
        }


_decoder = msgspec.msgpack.Decoder(ApiServerView)


def parse_own(view: ApiServerView) -> ParsedView:
    """This api server's own view, parsed (it is this process's own exposition: nothing to check)."""
    return ParsedView(parse_exposition(view.exposition), view.counted_seqs)


def parse_peer(data: bytes, own: ParsedView) -> ParsedView:
    """A peer's view from its bytes, checked as the module says against this api server's ``own``;
    :class:`BadView` otherwise."""
    if len(data) > MAX_VIEW_BYTES:
        raise BadView(f"{len(data)} bytes, more than the {MAX_VIEW_BYTES} a view can take")
    try:
        view = _decoder.decode(data)
    except msgspec.DecodeError as e:  # ValidationError included
        raise BadView(f"not a view: {e}") from None
    _check_counted_seqs(view.counted_seqs)
    try:
        families = parse_exposition(view.exposition)
    except Exception as e:  # noqa: BLE001 - the parser's errors on a hostile text are not all ValueError
        raise BadView(f"not an exposition: {type(e).__name__}: {e}") from None
    for family in families:
        if family.type not in _TYPES:
            raise BadView(f"{family.name} is of type {family.type}, which no api server exports")
        for sample in family.samples:
            if not 0.0 <= sample.value <= MAX_SAMPLE:  # NaN included
                raise BadView(f"{sample.name}{sample.labels} is {sample.value}")
    parsed = ParsedView(families, view.counted_seqs)
    theirs = parsed.exported_engines() & own.exported_engines()
    if theirs:
        engines = ", ".join(sorted(theirs))
        raise BadView(f"it exports engine {engines}, which this api server exports (engine_up)")
    return parsed


def _check_counted_seqs(by_index: dict[int, list[CountedSeqs]]) -> None:
    for index, runs in by_index.items():
        if index < 0 or len(runs) > MAX_RANGES_PER_ENGINE:
            raise BadView(f"engine {index} with {len(runs)} counted ranges")
        for run in runs:
            after = run.through_seq if run.after_seq is None else run.after_seq
            if not (0 <= run.incarnation < 2**64 and 0 <= after <= run.through_seq):
                raise BadView(f"engine {index}'s counted range {run} cannot be")
