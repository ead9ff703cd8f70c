"""Per-request speculative-decoding metrics in responses (vLLM's ``--per-request-spec-decode-metrics``)."""

from __future__ import annotations

import enum
from typing import Any

from openinfer.protocol import RequestSpecStats


class PerRequestSpecMetrics(enum.Enum):
    """How much of a request's spec-decode stats its final response carries under ``"metrics"``."""

    OFF = "off"
    SUMMARY = "summary"  # counts, mean acceptance length, acceptance rate, histogram
    DETAILED = "detailed"  # the summary plus per-position acceptance counts

    def response_metrics(self, stats: RequestSpecStats | None) -> dict[str, Any] | None:
        """The top-level ``"metrics"`` object of a final response, or None when there is none to add."""
        if self is PerRequestSpecMetrics.OFF or stats is None:
            return None
        steps, drafted, accepted = stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens
        hist = stats.accepted_length_hist  # K + 1 bins: drafts with 0..K tokens accepted
        speculative: dict[str, Any] = {
            "num_spec_tokens": stats.num_spec_tokens,
            "num_spec_steps": steps,
            "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted,
            "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,  # counts the bonus token
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "acceptance_histogram": list(hist),
        }
        if self is PerRequestSpecMetrics.DETAILED:
            # A prefix tally: a draft with n tokens accepted counts at positions 0..n-1.
            speculative["acceptance_per_position"] = [
                sum(hist[i + 1 :]) for i in range(stats.num_spec_tokens)
            ]
        return {"speculative_decoding": speculative}
