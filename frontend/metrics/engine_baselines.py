"""Per-engine baselines over cumulative engine counters: docs/design.md's frontend diffing, for any counter struct.

Engines send counters that are cumulative for their incarnation (spec decode, prefix cache) in every load
snapshot. A bridge keeps one :class:`EngineBaselines` per kind of counters and publishes the deltas its
:meth:`~EngineBaselines.observe` returns. The rules, per engine index:

- an index this process never saw: baseline = that snapshot, nothing published (an earlier frontend
  exported what came before, or it is zero: an incarnation's first message is its hello);
- a known index with a new incarnation, counters after None in one incarnation, or counters the baseline
  cannot be diffed against (spec decode: a new K): baseline zero, everything the new counters hold is new;
- a known incarnation whose counter went down (any field): a protocol violation, logged and counted as
  ``openinfer:protocol_errors_total{kind="counter_decrease"}``; baseline = snapshot, nothing published;
- a delta that breaks the counters' invariants although both snapshots hold them (no run of the engine's
  observe calls joins them): ``kind="counter_delta"``, baseline = snapshot, nothing published;
- counters None (that engine counts nothing of this kind now): the baseline is forgotten, nothing published.

An index whose series were dropped while its baseline is kept (:meth:`~EngineBaselines.drop_series`: its
record was forgotten) diffs its next counters as before and reports them as ``began``, so its series are
made again.

With ``--state-dir`` the baselines are saved with the totals they were published into (:meth:`saved`,
:meth:`restore`), so a restarted frontend diffs an incarnation it knew against its saved baseline.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

import msgspec

from openinfer.frontend.log_limit import LogRateLimiter
from openinfer.frontend.metrics.totals import CounterFamily

logger = logging.getLogger(__name__)


class CumulativeCounters(Protocol):
    """What the diffing needs of a counter struct (SpecDecodeCounters, PrefixCacheCounters)."""

    def minus(self, base: Self) -> Self: ...
    def copy(self) -> Self: ...
    def is_nonnegative(self) -> bool: ...
    def violation(self) -> str | None: ...


C = TypeVar("C", bound=CumulativeCounters)


class Reset(enum.Enum):
    """Why a known engine index's counters count from zero."""

    RESTART = "restart"  # a new incarnation
    BEGAN = "began"  # counters after None within one incarnation (spec decode: a drafter loaded)
    RESHAPED = "reshaped"  # counters the baseline cannot be diffed against (spec decode: a new K)


@dataclass(frozen=True)
class Observation(Generic[C]):
    """What one snapshot's counters mean for the engine's series."""

    delta: C | None  # to publish (possibly all zero); None: nothing (first sight, no counters, an error)
    began: bool  # counters new to this process (first sight or a reset): their series exist from now on
    reset: Reset | None = None  # set when a known index's counters count from zero


class SavedBaseline(msgspec.Struct, Generic[C], array_like=True):
    """An engine index's baseline as ``--state-dir`` saves it."""

    incarnation: int
    counters: C | None  # None: the engine counted nothing of this kind


def _always_same_shape(baseline: object, counters: object) -> bool:
    return True


class EngineBaselines(Generic[C]):
    """One baseline per engine index for one kind of cumulative counters (``what`` names it in logs)."""

    def __init__(
        self,
        what: str,
        protocol_errors: CounterFamily,
        same_shape: Callable[[C, C], bool] = _always_same_shape,
    ) -> None:
        self._what = what
        self._protocol_errors = protocol_errors  # openinfer:protocol_errors_total{kind}
        self._same_shape = same_shape  # False: the counters restart from zero (Reset.RESHAPED)
        self._baselines: dict[int, SavedBaseline[C]] = {}
        self._unexported: set[int] = set()  # indices with a baseline whose series were dropped
        self._log = LogRateLimiter(logger)  # an engine can send a bad snapshot in every message

    def saved(self) -> dict[int, SavedBaseline[C]]:
        """Every engine index's baseline now (copies), for ``--state-dir``."""
        return {index: _copy(b) for index, b in self._baselines.items()}

    def restore(self, saved: dict[int, SavedBaseline[C]]) -> None:
        """Take baselines saved with the totals they were published into; impossible ones are dropped."""
        for index, baseline in saved.items():
            if baseline.counters is not None and baseline.counters.violation() is not None:
                logger.warning(
                    "state: engine %d's saved %s baseline is impossible; dropped", index, self._what
                )
                continue
            self._baselines[index] = _copy(baseline)

    def knows(self, engine_index: int) -> bool:
        """Whether this process holds a baseline for ``engine_index`` (saved, restored or taken)."""
        return engine_index in self._baselines

    def drop_series(self, engine_index: int) -> None:
        """Its series were dropped (they never moved); the baseline stays, and the next counters of the index
        report ``began`` so that its series are made again."""
        if engine_index in self._baselines:
            self._unexported.add(engine_index)

    def forget(self, engine_index: int) -> None:
        """Drop an engine index's baseline: its next counters are a first sight."""
        self._baselines.pop(engine_index, None)
        self._unexported.discard(engine_index)

    def observe(self, engine_index: int, incarnation: int, counters: C | None) -> Observation[C]:
        """Take one snapshot's counters: the delta since the baseline, which becomes the snapshot."""
        baseline = self._baselines.get(engine_index)
        if baseline is None:  # never seen by this process: what came before is not ours to count
            self._baselines[engine_index] = _copy(SavedBaseline(incarnation, counters))
            return Observation(None, began=counters is not None)
        if counters is None:
            if baseline.counters is not None and baseline.incarnation == incarnation:
                self._log.info(
                    "baseline_dropped",
                    "engine %d sends no %s counters now; its baseline is dropped",
                    engine_index,
                    self._what,
                )
            baseline.incarnation, baseline.counters = incarnation, None
            return Observation(None, began=False)

        reset = self._reset(baseline, incarnation, counters)
        if reset is not None:
            self._log.info(
                "counter_reset", "engine %d incarnation %016x: %s counters count from zero (%s)",
                engine_index, incarnation, self._what, reset.value,
            )  # fmt: skip
            zero = counters.minus(counters)  # of the same shape (K)
            baseline.incarnation, baseline.counters = incarnation, zero
        previous = baseline.counters
        assert previous is not None

        delta = counters.minus(previous)
        baseline.counters = counters.copy()
        began = reset is not None or engine_index in self._unexported
        self._unexported.discard(engine_index)
        if not delta.is_nonnegative():
            self._protocol_errors.inc(("counter_decrease",))
            self._log.warning(
                "counter_decrease",
                "engine %d incarnation %016x: a %s counter went down (%s -> %s); nothing published",
                engine_index, incarnation, self._what, previous, counters,
            )  # fmt: skip
            return Observation(None, began, reset)
        violation = delta.violation()
        if violation is not None:  # both snapshots were valid, but nothing the engine counts joins them
            self._protocol_errors.inc(("counter_delta",))
            self._log.warning(
                "counter_delta", "engine %d incarnation %016x: impossible %s delta (%s); nothing published",
                engine_index, incarnation, self._what, violation,
            )  # fmt: skip
            return Observation(None, began, reset)
        return Observation(delta, began, reset)

    def _reset(self, baseline: SavedBaseline[C], incarnation: int, counters: C) -> Reset | None:
        """Why counters of a known engine index start from zero, or None when they continue the baseline."""
        if baseline.incarnation != incarnation:
            return Reset.RESTART
        if baseline.counters is None:
            return Reset.BEGAN
        if not self._same_shape(baseline.counters, counters):
            return Reset.RESHAPED
        return None


def _copy(baseline: SavedBaseline[C]) -> SavedBaseline[C]:
    counters = baseline.counters
    return SavedBaseline(baseline.incarnation, None if counters is None else counters.copy())
