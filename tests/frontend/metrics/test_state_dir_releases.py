"""--state-dir files written by earlier releases: their spec baselines lack fields the counters gained since;
they load, the totals go on, only each baseline's incarnation is kept, and the next incarnation counts from
zero as a restart."""

from __future__ import annotations

from pathlib import Path

from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.metrics.state_dir import STATE_FILE, StateDir
from openinfer.protocol import SpecDecodeCounters
from tests.frontend.metrics.metrics_samples import counters, drafts, load, value


def test_baselines_of_a_release_without_reached_counts(tmp_path: Path) -> None:
    """A state file whose spec baselines lack the reached counts and confidence sums (protocol version 3)
    loads: the totals go on, only the incarnation is kept, and the index's next incarnation counts from zero
    as a restart, its reached series included."""
    (tmp_path / STATE_FILE).write_text(
        '{"version": 1, "totals": {"counters": {"vllm:spec_decode_num_drafts": [[["m", "0"], 2.0]]}, '
        '"histograms": {}}, "spec_baselines": {"0": [111, [2, 2, 3, 1, [1, 0], [1, 1, 0], [2, 1], 0]]}, '
        '"incarnations": {"0": 111}}'
    )  # K=2 after drafts (2 tokens, 1 accepted) and (1, 0)
    metrics = FrontendMetrics(StateDir(tmp_path))
    assert metrics.state().spec_baselines[0].counters is None  # the incarnation alone is kept
    metrics.engine_joined(0, 222)
    fresh = SpecDecodeCounters.zero(2)
    fresh.observe_draft(2, 0, confidence=[0.25, 0.5])
    metrics.observe_load(0, 222, "m", load(fresh))
    assert drafts(metrics, "0") == 3
    assert value(metrics, "openinfer:spec_decode_counter_resets_total", engine="0", reason="restart") == 1
    reached = "openinfer:spec_decode_num_reached_per_pos_total"
    assert value(metrics, reached, model_name="m", engine="0", position="0") == 1
    micros = "openinfer:spec_decode_confidence_micros_per_pos_total"
    assert value(metrics, micros, model_name="m", engine="0", position="0") == 250_000


def test_baselines_of_a_release_without_verified_counts(tmp_path: Path) -> None:
    """A state file whose spec baselines lack the per-position verified counts (an older release) loads: the
    totals go on, and the index's next incarnation (that release's engines speak another protocol, so every
    engine is one) counts from zero as a restart, its new series included."""
    (tmp_path / STATE_FILE).write_text(
        '{"version": 1, "totals": {"counters": {"vllm:spec_decode_num_drafts": [[["m", "0"], 2.0]]}, '
        '"histograms": {}}, "spec_baselines": {"0": [111, [2, 2, 3, 1, [1, 0], [1, 1, 0]]]}, '
        '"incarnations": {"0": 111}}'
    )  # K=2 after drafts (2 tokens, 1 accepted) and (1, 0)
    metrics = FrontendMetrics(StateDir(tmp_path))
    assert metrics.state().spec_baselines[0].counters is None  # the incarnation alone is kept
    metrics.engine_joined(0, 222)
    metrics.observe_load(0, 222, "m", load(counters(2, (2, 2))))
    assert drafts(metrics, "0") == 3
    assert value(metrics, "openinfer:engine_restarts_total", engine="0") == 1
    assert value(metrics, "openinfer:spec_decode_counter_resets_total", engine="0", reason="restart") == 1
    per_pos = "openinfer:spec_decode_num_draft_tokens_per_pos_total"
    assert value(metrics, per_pos, model_name="m", engine="0", position="1") == 1
