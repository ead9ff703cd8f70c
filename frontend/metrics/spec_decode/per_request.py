"""Per-request speculative-decoding metrics in responses (vLLM's ``--per-request-spec-decode-metrics``)."""

from __future__ import annotations

import enum
from typing import Any

from openinfer.frontend.metrics.spec_decode.acceptance_tally import AcceptanceTally
from openinfer.protocol import SpecDecodeCounters


class PerRequestSpecMetrics(enum.Enum):
    """How much of a request's spec-decode stats its final response carries under ``"metrics"``."""

    OFF = "off"
    SUMMARY = "summary"  # counts (unverified tokens too), mean acceptance length, acceptance rate, histogram
    DETAILED = "detailed"  # the summary plus per-position counts: accepted, verified, reached, confidence

    def response_metrics(self, stats: SpecDecodeCounters | None) -> dict[str, Any] | None:
        """The top-level ``"metrics"`` object of a final response, or None when there is none to add."""
        if self is PerRequestSpecMetrics.OFF or stats is None:
            return None
        tally = AcceptanceTally()
        tally.add_counters(stats)
        steps, drafted, accepted = tally.num_drafts, tally.num_draft_tokens, tally.num_accepted_tokens
        speculative: dict[str, Any] = {
            "num_spec_tokens": stats.num_spec_tokens,
            "num_spec_steps": steps,
            "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted,
            "mean_acceptance_length": tally.mean_acceptance_length
            if steps
            else 1.0,  # counts the bonus token
            "draft_acceptance_rate": tally.acceptance_rate if drafted else 0.0,
            "acceptance_histogram": list(tally.hist),
            "num_unverified_draft_tokens": tally.num_unverified_tokens,
        }
        if self is PerRequestSpecMetrics.DETAILED:
            speculative["acceptance_per_position"] = list(tally.per_pos)
            # drafts whose token at each position was verified: the conditional rate's denominator
            speculative["draft_tokens_per_position"] = list(tally.draft_per_pos)
            # drafts that reached each position (verified, every token before it accepted) and a confidence
            # head's ratings of those tokens summed in millionths: its calibration, exactly
            speculative["reached_per_position"] = list(tally.reached_per_pos)
            speculative["confidence_micros_per_position"] = list(tally.confidence_micros_per_pos)
        return {"speculative_decoding": speculative}
