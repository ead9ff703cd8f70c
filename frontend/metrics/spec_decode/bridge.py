"""The spec-decode metrics bridge: per-engine baselines over cumulative counters -> Prometheus counters.

Each engine sends its cumulative :class:`SpecDecodeCounters` in every load snapshot. This module keeps one
baseline per engine index and publishes ``current - baseline`` by the rules of
:mod:`openinfer.frontend.metrics.engine_baselines` (docs/design.md, frontend diffing):

- an engine index this process never saw: baseline = that snapshot, nothing published (an earlier frontend
  exported what came before, or it is zero: an incarnation's first message is its hello);
- a known index with a new incarnation, a new K, or counters after None (a drafter loaded): baseline zero,
  everything the new counters hold is new; the reset is logged and counted;
- a known incarnation whose counter went down (any field or bin): a protocol violation, logged and counted
  as ``openinfer:protocol_errors_total{kind="counter_decrease"}``; baseline = snapshot, nothing published;
  a delta no sequence of drafts makes: ``kind="counter_delta"``, nothing published;
- ``spec_decode`` None (no drafter): the baseline is forgotten, nothing published;
- an interval in which nothing was counted publishes nothing (one whose rounds were all left unverified
  publishes its unverified tokens: they would be lost otherwise, the baseline moves on).

Snapshots that break a counter invariant never get here: the codec drops them (kind "counters").

With ``--state-dir`` the baselines are saved together with the totals they were published into
(:mod:`openinfer.frontend.metrics.state_dir`); a restarted frontend restores both, so an incarnation it knew goes on
from its saved baseline and the series continue exactly.

Exported series, one per (model_name, engine[, position | accepted]), never an "all engines" one:

- ``vllm:spec_decode_num_drafts_total``
- ``vllm:spec_decode_num_draft_tokens_total``
- ``vllm:spec_decode_num_accepted_tokens_total``
- ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0".."K-1"}``
- ``openinfer:spec_decode_accepted_length_total{accepted="0".."K"}`` (drafts by accepted count)
- ``openinfer:spec_decode_num_draft_tokens_per_pos_total{position="0".."K-1"}`` (drafts whose token at the
  position was verified: with variable verify lengths, the per-position denominator)
- ``openinfer:spec_decode_num_unverified_draft_tokens_total`` (proposed, left out by the scheduler; never
  counted as draft tokens, so never as rejected)
- ``openinfer:spec_decode_num_reached_per_pos_total{position="0".."K-1"}`` (drafts whose token at the
  position was verified with every token before it accepted: the conditional acceptance's denominator)
- ``openinfer:spec_decode_confidence_micros_per_pos_total{position="0".."K-1"}`` (a confidence head's
  ratings of those same tokens, summed in millionths: integers, so exact and diffable; 0 without one)
- ``openinfer:spec_decode_counter_resets_total{engine,reason="restart"|"new_k"|"drafter_loaded"}``

Derived rates, for dashboards (sum over engines first; drop the ``sum`` for one engine):

- draft acceptance rate::

    sum(rate(vllm:spec_decode_num_accepted_tokens_total[5m]))
      / sum(rate(vllm:spec_decode_num_draft_tokens_total[5m]))

- mean acceptance length (tokens per verify step, counting the bonus token)::

    1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total[5m]))
          / sum(rate(vllm:spec_decode_num_drafts_total[5m]))

- per-position acceptance rate (one series per position)::

    sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total[5m]))
      / scalar(sum(rate(vllm:spec_decode_num_drafts_total[5m])))

  (with engines of different K, divide position i by the drafts of engines whose K > i only)

- conditional per-position acceptance rate (accepted when verified; equal to the above while every draft is
  verified whole, higher where the scheduler verifies fewer tokens; no K caveat)::

    sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total[5m]))
      / sum by (position) (rate(openinfer:spec_decode_num_draft_tokens_per_pos_total[5m]))

- share of proposed draft tokens left unverified::

    sum(rate(openinfer:spec_decode_num_unverified_draft_tokens_total[5m]))
      / (sum(rate(openinfer:spec_decode_num_unverified_draft_tokens_total[5m]))
         + sum(rate(vllm:spec_decode_num_draft_tokens_total[5m])))

- the confidence head's calibration (DSpark), per position: its mean confidence and the measured
  conditional acceptance (accepted given every token before it accepted) over the same drafts; a
  calibrated head has the two equal::

    sum by (position) (rate(openinfer:spec_decode_confidence_micros_per_pos_total[5m])) / 1e6
      / sum by (position) (rate(openinfer:spec_decode_num_reached_per_pos_total[5m]))
    sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total[5m]))
      / sum by (position) (rate(openinfer:spec_decode_num_reached_per_pos_total[5m]))

- share of drafts with ``n`` tokens accepted::

    sum by (accepted) (rate(openinfer:spec_decode_accepted_length_total[5m]))
      / scalar(sum(rate(vllm:spec_decode_num_drafts_total[5m])))
"""

from __future__ import annotations

from openinfer.frontend.metrics.engine_baselines import EngineBaselines, Reset, SavedBaseline
from openinfer.frontend.metrics.totals import CounterFamily, MetricTotals
from openinfer.protocol import SpecDecodeCounters

_MODEL_ENGINE = ("model_name", "engine")
# openinfer:spec_decode_counter_resets_total's reason label, by why the counters count from zero.
_RESET_REASONS = {Reset.RESTART: "restart", Reset.BEGAN: "drafter_loaded", Reset.RESHAPED: "new_k"}


class SpecDecodeMetrics:
    """The spec-decode Prometheus counters and the per-engine baselines they are published from."""

    def __init__(self, totals: MetricTotals, protocol_errors: CounterFamily) -> None:
        # saved with the totals (--state-dir; restored through restore_baselines), asked and forgotten by
        # FrontendMetrics
        self.baselines = EngineBaselines[SpecDecodeCounters](
            "spec-decode", protocol_errors, lambda a, b: a.num_spec_tokens == b.num_spec_tokens
        )
        self.num_drafts = totals.counter(
            "vllm:spec_decode_num_drafts",
            "Speculative drafts verified (one request's proposal in one verify step).",
            _MODEL_ENGINE,
        )
        self.num_draft_tokens = totals.counter(
            "vllm:spec_decode_num_draft_tokens",
            "Draft tokens verified (proposed and sent to the target).",
            _MODEL_ENGINE,
        )
        self.num_accepted_tokens = totals.counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Draft tokens accepted (never the target's bonus token).",
            _MODEL_ENGINE,
        )
        self.num_accepted_tokens_per_pos = totals.counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Drafts whose token at this position (0..K-1) was accepted.",
            (*_MODEL_ENGINE, "position"),
        )
        self.accepted_length = totals.counter(
            "openinfer:spec_decode_accepted_length",
            "Drafts by how many of their tokens were accepted (0..K).",
            (*_MODEL_ENGINE, "accepted"),
        )
        self.num_draft_tokens_per_pos = totals.counter(
            "openinfer:spec_decode_num_draft_tokens_per_pos",
            "Drafts whose token at this position (0..K-1) was verified.",
            (*_MODEL_ENGINE, "position"),
        )
        self.num_unverified_draft_tokens = totals.counter(
            "openinfer:spec_decode_num_unverified_draft_tokens",
            "Draft tokens proposed but never verified (the scheduler verified fewer); never counted as rejected.",
            _MODEL_ENGINE,
        )
        self.num_reached_per_pos = totals.counter(
            "openinfer:spec_decode_num_reached_per_pos",
            "Drafts whose token at this position (0..K-1) was verified with every token before it accepted.",
            (*_MODEL_ENGINE, "position"),
        )
        self.confidence_micros_per_pos = totals.counter(
            "openinfer:spec_decode_confidence_micros_per_pos",
            "A confidence head's ratings (millionths) of the draft tokens counted in "
            "openinfer:spec_decode_num_reached_per_pos_total, summed; 0 without a confidence head.",
            (*_MODEL_ENGINE, "position"),
        )
        self.counter_resets = totals.counter(
            "openinfer:spec_decode_counter_resets",
            "Times an engine's spec-decode counters began again at zero: restart, new K, drafter loaded.",
            ("engine", "reason"),
        )

    def restore_baselines(self, saved: dict[int, SavedBaseline[SpecDecodeCounters]]) -> None:
        """Take baselines saved with the totals they were published into: a known incarnation goes on from
        its saved counters (nothing lost, nothing counted twice); a new one counts from zero.

        A baseline saved by a release before the per-position verified or reached counts (its counters lack
        them) is of an engine incarnation of that release, which this one refuses (protocol version): only
        its incarnation is kept, so that the index's next incarnation counts from zero as a restart.
        """
        self.baselines.restore({index: _without_old_counters(baseline) for index, baseline in saved.items()})

    def observe(
        self, engine_index: int, incarnation: int, model_name: str, counters: SpecDecodeCounters | None
    ) -> SpecDecodeCounters | None:
        """Take one snapshot's counters; publish and return the delta since the baseline, or None."""
        seen = self.baselines.observe(engine_index, incarnation, counters)
        if seen.reset is not None:
            self.counter_resets.inc((str(engine_index), _RESET_REASONS[seen.reset]))
        if seen.began:
            assert counters is not None
            self._create_series(model_name, engine_index, counters.num_spec_tokens)
        delta = seen.delta
        if delta is None or delta.is_zero():
            return None
        self._publish(model_name, engine_index, delta)
        return delta

    def _publish(self, model_name: str, engine_index: int, delta: SpecDecodeCounters) -> None:
        labels = (model_name, str(engine_index))
        self.num_drafts.inc(labels, delta.num_drafts)
        self.num_draft_tokens.inc(labels, delta.num_draft_tokens)
        self.num_accepted_tokens.inc(labels, delta.num_accepted_tokens)
        self.num_unverified_draft_tokens.inc(labels, delta.num_unverified_draft_tokens)
        binned = (  # each family's third label is the bin: a position 0..K-1, or accepted 0..K
            (self.num_accepted_tokens_per_pos, delta.num_accepted_tokens_per_pos),
            (self.accepted_length, delta.accepted_length_hist),
            (self.num_draft_tokens_per_pos, delta.num_draft_tokens_per_pos),
            (self.num_reached_per_pos, delta.num_reached_per_pos),
            (self.confidence_micros_per_pos, delta.confidence_micros_per_pos),
        )
        for family, counts in binned:
            for bin_index, count in enumerate(counts):
                family.inc((*labels, str(bin_index)), count)

    def _create_series(self, model_name: str, engine_index: int, num_spec_tokens: int) -> None:
        """Export an engine's series at 0 from the moment they exist, so rate() sees their first increase."""
        self._publish(model_name, engine_index, SpecDecodeCounters.zero(num_spec_tokens))


def _without_old_counters(baseline: SavedBaseline[SpecDecodeCounters]) -> SavedBaseline[SpecDecodeCounters]:
    """The baseline, or only its incarnation when its counters predate ``num_draft_tokens_per_pos`` (protocol
    version 3) or ``num_reached_per_pos`` (version 4)."""
    counters = baseline.counters
    if counters is not None and not (counters.num_draft_tokens_per_pos and counters.num_reached_per_pos):
        return SavedBaseline(baseline.incarnation, None)
    return baseline
