"""Checks of the recording rules' values against spec-log tallies (tests/deploy/test_prometheus_live.py says
why the ratios must be exact up to float rounding)."""

from __future__ import annotations

import pytest

from openinfer.tools.spec_tally import AcceptanceTally, total
from tests.deploy.stack import Prometheus

REL = 1e-12  # float rounding only


def check_host_ratios(prometheus: Prometheus, at: float, logs: dict[int, AcceptanceTally], ks: tuple) -> None:
    """The host-level recorded ratios at ``at`` equal the spec logs' (up to float rounding)."""
    everything = total(logs.values())
    assert everything.num_drafts > 0 and 0 < everything.num_accepted_tokens < everything.num_draft_tokens

    (rate,) = prometheus.vector("model_name:spec_decode_acceptance_rate:ratio_rate1m", at).values()
    expected = everything.num_accepted_tokens / everything.num_draft_tokens
    assert rate == pytest.approx(expected, rel=REL, abs=0)

    (length,) = prometheus.vector("model_name:spec_decode_mean_acceptance_length:ratio_rate1m", at).values()
    assert length == pytest.approx(1 + everything.num_accepted_tokens / everything.num_drafts, rel=REL, abs=0)

    # Position i over the drafts of engines with K > i.
    per_pos = prometheus.vector("model_name:spec_decode_per_pos_acceptance_rate:ratio_rate1m", at, "position")
    expected_pos = {}
    for i in range(max(ks)):
        drafts = sum(logs[e].num_drafts for e, k in enumerate(ks) if k > i)
        if drafts:
            accepted = sum(logs[e].per_pos[i] for e, k in enumerate(ks) if k > i)
            expected_pos[(str(i),)] = accepted / drafts
    assert per_pos.keys() == expected_pos.keys()
    for key, value in expected_pos.items():
        assert per_pos[key] == pytest.approx(value, rel=REL, abs=1e-15), key

    # Conditional: position i over the drafts that verified it (those of engines with K <= i verify none).
    conditional = prometheus.vector(
        "model_name:spec_decode_per_pos_conditional_acceptance_rate:ratio_rate1m", at, "position"
    )
    expected_conditional = {
        (str(i),): rate
        for i, rate in enumerate(everything.conditional_rates())
        if everything.draft_per_pos[i]
    }
    assert conditional.keys() == expected_conditional.keys()
    for key, value in expected_conditional.items():
        assert conditional[key] == pytest.approx(value, rel=REL, abs=1e-15), key
    per_engine_conditional = prometheus.vector(
        "engine:spec_decode_per_pos_conditional_acceptance_rate:ratio_rate1m", at, "engine", "position"
    )
    assert per_engine_conditional == pytest.approx(
        {
            (str(e), str(i)): rate
            for e, tally in logs.items()
            for i, rate in enumerate(tally.conditional_rates())
            if tally.draft_per_pos[i]
        },
        rel=REL,
        abs=1e-15,
    )
    (unverified,) = prometheus.vector("model_name:spec_decode_unverified_share:ratio_rate1m", at).values()
    proposed = everything.num_unverified_tokens + everything.num_draft_tokens
    assert unverified == pytest.approx(everything.num_unverified_tokens / proposed, rel=REL, abs=0)

    shares = prometheus.vector("model_name:spec_decode_accepted_length_share:ratio_rate1m", at, "accepted")
    hist = everything.hist + [0] * (max(ks) + 1 - len(everything.hist))
    assert shares.keys() == {(str(n),) for n in range(max(ks) + 1)}
    for n, count in enumerate(hist):
        assert shares[(str(n),)] == pytest.approx(count / everything.num_drafts, rel=REL, abs=1e-15), n

    per_engine = prometheus.vector("engine:spec_decode_acceptance_rate:ratio_rate1m", at, "engine")
    for e, tally in logs.items():
        if tally.num_draft_tokens:
            expected = tally.num_accepted_tokens / tally.num_draft_tokens
            assert per_engine[(str(e),)] == pytest.approx(expected, rel=REL, abs=1e-15), e
        else:
            assert (str(e),) not in per_engine  # the `> 0` guard: no draft tokens, no ratio


def check_totals(prometheus: Prometheus, at: float | None, tally: AcceptanceTally, k_max: int) -> None:
    """The recorded totals, summed over every series the server has (hosts too), equal ``tally``."""

    def one(expr: str) -> float:
        (value,) = prometheus.vector(f"sum({expr})", at).values()
        return value

    assert one("model_name:spec_decode_num_drafts:sum") == tally.num_drafts
    assert one("model_name:spec_decode_num_draft_tokens:sum") == tally.num_draft_tokens
    assert one("model_name:spec_decode_num_accepted_tokens:sum") == tally.num_accepted_tokens
    per_pos = prometheus.vector(
        "sum by (position) (model_name:spec_decode_num_accepted_tokens_per_pos:sum)", at, "position"
    )
    assert per_pos == {(str(i),): tally.bins(k_max)[f"per_pos[{i}]"] for i in range(k_max)}
    hist = prometheus.vector("sum by (accepted) (model_name:spec_decode_accepted_length:sum)", at, "accepted")
    assert hist == {(str(n),): tally.bins(0, k_max + 1)[f"hist[{n}]"] for n in range(k_max + 1)}
    verified = prometheus.vector(
        "sum by (position) (model_name:spec_decode_num_draft_tokens_per_pos:sum)", at, "position"
    )
    assert verified == {(str(i),): tally.bins(k_max)[f"draft_per_pos[{i}]"] for i in range(k_max)}
    assert one("model_name:spec_decode_num_unverified_draft_tokens:sum") == tally.num_unverified_tokens
