"""An in-process FrontendMetrics in the --state-dir tests: the load snapshots fed to it and the samples read
back from its registry (model m)."""

from __future__ import annotations

from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.protocol import LoadSnapshot, SpecDecodeCounters


def counters(k: int, *drafts: tuple[int, int]) -> SpecDecodeCounters:
    c = SpecDecodeCounters.zero(k)
    for num_draft_tokens, num_accepted in drafts:
        c.observe_draft(num_draft_tokens, num_accepted)
    return c


def load(spec: SpecDecodeCounters | None) -> LoadSnapshot:
    return LoadSnapshot(0, 10, 0, 0, spec)


def value(metrics: FrontendMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def drafts(metrics: FrontendMetrics, engine: str) -> float:
    return value(metrics, "vllm:spec_decode_num_drafts_total", model_name="m", engine=engine)


def per_position(metrics: FrontendMetrics, name: str, k: int) -> list[float]:
    """Engine 0's per-position series ``name`` of model m, positions 0..k-1."""
    return [value(metrics, name, model_name="m", engine="0", position=str(i)) for i in range(k)]
