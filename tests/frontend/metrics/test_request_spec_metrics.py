"""Per-request spec-decode metrics on the final response (--per-request-spec-decode-metrics)."""

from __future__ import annotations

from openinfer.frontend.metrics.spec_decode.per_request import PerRequestSpecMetrics
from openinfer.protocol import SpecDecodeCounters
from tests.frontend.engine_peer import PeerConfig
from tests.frontend.frontends import FrontendFactory, PeerFactory
from tests.frontend.openai.http_calls import post, stream

# K=3, 4 drafts verifying 2, 3, 3 and 3 tokens with 0, 1, 2 and 3 accepted: 6 of 11 draft tokens accepted;
# the first was trimmed from 3 proposed, so 1 token went unverified. They reach positions [0], [0, 1],
# [0, 1, 2] and [0, 1, 2], rated [.9], [.8, .6], [.7, .7, .3] and [.95, .9, .85] there.
STATS = SpecDecodeCounters(3, num_drafts=4, num_draft_tokens=11, num_accepted_tokens=6,
                           num_accepted_tokens_per_pos=[3, 2, 1], accepted_length_hist=[1, 1, 1, 1],
                           num_draft_tokens_per_pos=[4, 4, 3], num_unverified_draft_tokens=1,
                           num_reached_per_pos=[4, 3, 2],
                           confidence_micros_per_pos=[3_350_000, 2_200_000, 1_150_000])  # fmt: skip
SUMMARY = {
    "num_spec_tokens": 3,
    "num_spec_steps": 4,
    "num_draft_tokens": 11,
    "num_accepted_draft_tokens": 6,
    "mean_acceptance_length": 2.5,  # 1 + 6 / 4
    "draft_acceptance_rate": 6 / 11,
    "acceptance_histogram": [1, 1, 1, 1],
    "num_unverified_draft_tokens": 1,
}


async def test_summary_on_a_non_streaming_response(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """summary (the default): the response's top-level "metrics" holds the request's counts and rates."""
    frontend = await start_frontend()
    await start_peer(frontend, PeerConfig(spec_stats=STATS))
    status, body = await post(frontend, {"prompt": [50, 60, 70], "max_tokens": 3})
    assert status == 200
    assert body["metrics"] == {"speculative_decoding": SUMMARY}


async def test_detailed_on_the_last_stream_chunk(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """detailed, streaming: only the chunk with finish_reason has "metrics", with per-position counts of
    accepted, verified and reached draft tokens and the confidence sums."""
    frontend = await start_frontend(per_request_spec_metrics=PerRequestSpecMetrics.DETAILED)
    await start_peer(frontend, PeerConfig(spec_stats=STATS))
    body = {"prompt": [50, 60, 70], "max_tokens": 3, "stream_options": {"include_usage": True}}
    *chunks, usage, done = await stream(frontend, body)
    assert done == "[DONE]" and "metrics" not in usage
    assert [("metrics" in c, c["choices"][0]["finish_reason"]) for c in chunks] == [
        (False, None), (False, None), (True, "length"),
    ]  # fmt: skip
    # Drafts with 1, 2, 3 accepted reach position 0; with 2, 3 position 1; with 3 position 2. Every draft
    # verified positions 0 and 1, the three of 3 tokens position 2.
    assert chunks[-1]["metrics"] == {
        "speculative_decoding": {
            **SUMMARY,
            "acceptance_per_position": [3, 2, 1],
            "draft_tokens_per_position": [4, 4, 3],
            "reached_per_position": [4, 3, 2],
            "confidence_micros_per_position": [3_350_000, 2_200_000, 1_150_000],
        }
    }

    _, body = await post(frontend, {"prompt": [50, 60, 70], "max_tokens": 2})
    assert body["metrics"]["speculative_decoding"]["acceptance_per_position"] == [3, 2, 1]


async def test_no_metrics_when_off_or_without_a_drafter(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """off: no "metrics" key even with stats; summary without stats (no drafter): no key either."""
    off = await start_frontend(per_request_spec_metrics=PerRequestSpecMetrics.OFF)
    await start_peer(off, PeerConfig(spec_stats=STATS))
    _, body = await post(off, {"prompt": [50, 60, 70], "max_tokens": 2})
    assert "metrics" not in body
    plain = await start_frontend()
    await start_peer(plain)
    _, body = await post(plain, {"prompt": [50, 60, 70], "max_tokens": 2})
    assert "metrics" not in body


def test_no_drafts_mean_length_one_and_rate_zero() -> None:
    """A request that never drafted: mean acceptance length 1.0 and acceptance rate 0.0, not NaN."""
    stats = SpecDecodeCounters.zero(2)
    got = PerRequestSpecMetrics.DETAILED.response_metrics(stats)
    assert got == {"speculative_decoding": {
        "num_spec_tokens": 2, "num_spec_steps": 0, "num_draft_tokens": 0, "num_accepted_draft_tokens": 0,
        "mean_acceptance_length": 1.0, "draft_acceptance_rate": 0.0, "acceptance_histogram": [0, 0, 0],
        "num_unverified_draft_tokens": 0, "acceptance_per_position": [0, 0], "draft_tokens_per_position": [0, 0],
        "reached_per_position": [0, 0], "confidence_micros_per_position": [0, 0],
    }}  # fmt: skip
