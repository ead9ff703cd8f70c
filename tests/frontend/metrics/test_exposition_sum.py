"""The sum of api servers' expositions: every sample summed over them, each family once, in order."""

from __future__ import annotations

import pytest

from openinfer.frontend.metrics.exposition_sum import sum_expositions
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.protocol import LoadSnapshot, SpecDecodeCounters
from tests.frontend.metrics.scrape import sample


def api_server(requests: int, engine: int | None, drafts: int) -> str:
    """A frontend's exposition: ``requests`` finished on engine 0 here, and, when it is ``engine``'s
    metrics frontend, that engine's counters after ``drafts`` drafts of 2 tokens, 1 accepted."""
    metrics = FrontendMetrics()
    for _ in range(requests):
        metrics.observe_first_token("m", 0, 10, 0.02)
        metrics.observe_finish("m", 0, "stop", 0.4)
    if engine is not None:
        counters = SpecDecodeCounters.zero(2)
        metrics.observe_load(engine, 7, "m", LoadSnapshot(1, 4, 1, 0, counters.copy()))  # first sight
        for _ in range(drafts):
            counters.observe_draft(2, 1)
        metrics.observe_load(engine, 7, "m", LoadSnapshot(3, 4, 2, 1, counters))
    return metrics.render().decode()


def test_request_metrics_add_up_and_engine_series_come_from_their_metrics_frontend() -> None:
    """Request counters and histogram buckets are summed; each engine's counters and gauges, exported by one
    api server only, appear once with its values."""
    merged = sum_expositions([api_server(2, 0, 3), api_server(5, 1, 4), api_server(1, None, 0)]).decode()
    assert (
        sample(merged, "vllm:request_success_total", model_name="m", engine="0", finished_reason="stop") == 8
    )
    assert sample(merged, "vllm:prompt_tokens_total", model_name="m", engine="0") == 80  # 8 requests of 10
    assert sample(merged, "vllm:e2e_request_latency_seconds_count", model_name="m") == 8
    assert sample(merged, "vllm:e2e_request_latency_seconds_bucket", model_name="m", le="0.5") == 8  # 0.4 s
    assert sample(merged, "vllm:e2e_request_latency_seconds_bucket", model_name="m", le="0.3") == 0
    assert sample(merged, "vllm:e2e_request_latency_seconds_sum", model_name="m") == pytest.approx(3.2)
    assert sample(merged, "vllm:spec_decode_num_drafts_total", model_name="m", engine="0") == 3
    assert sample(merged, "vllm:spec_decode_num_drafts_total", model_name="m", engine="1") == 4
    assert sample(merged, "vllm:spec_decode_num_accepted_tokens_per_pos_total", model_name="m", engine="1",
                  position="1") == 0  # fmt: skip
    assert sample(merged, "vllm:num_requests_running", model_name="m", engine="1") == 2
    assert sample(merged, "vllm:kv_cache_usage_perc", model_name="m", engine="0") == 0.75
    assert merged.count("# TYPE vllm:spec_decode_num_drafts_total counter") == 1


def test_one_exposition_is_itself() -> None:
    """A single api server's exposition comes back with the same samples."""
    text = api_server(3, 0, 2)
    assert sum_expositions([text]).decode() == text


def test_a_family_of_two_types_is_refused() -> None:
    """Expositions that disagree on a family's type are not summed (ValueError), never mixed."""
    with pytest.raises(ValueError, match="x is a gauge here and a counter there"):
        sum_expositions(["# TYPE x counter\nx_total 1.0\n", "# TYPE x gauge\nx 2.0\n"])
