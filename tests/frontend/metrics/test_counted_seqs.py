"""Which seqs of each engine incarnation /metrics counted: ranges recorded as snapshots are taken, saved with
the totals in --state-dir."""

from __future__ import annotations

from pathlib import Path

from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.metrics.spec_decode.counted_seqs import MAX_RANGES_PER_ENGINE, CountedSeqsLog
from openinfer.frontend.metrics.state_dir import StateDir
from openinfer.protocol import LoadSnapshot, SpecDecodeCounters


def load(*drafts: tuple[int, int]) -> LoadSnapshot:
    counters = SpecDecodeCounters.zero(3)
    for num_draft_tokens, num_accepted in drafts:
        counters.observe_draft(num_draft_tokens, num_accepted)
    return LoadSnapshot(0, 10, 0, 0, counters)


def test_first_sight_then_restart_give_the_ranges_metrics_holds() -> None:
    """An index first seen at seq 5 counts seqs 6..9 of that incarnation; its next incarnation counts from
    zero (after_seq None) through its latest seq."""
    metrics = FrontendMetrics()
    for seq in (5, 6, 9):  # a frontend that joined late: seq 5 is its baseline
        metrics.observe_message(0, 0xA, seq, "m", load((3, 1)))
    metrics.observe_message(0, 0xB, 0, "m", load())
    metrics.observe_message(0, 0xB, 4, "m", load((2, 2)))
    metrics.observe_message(1, 0xC, 0, "m", load())
    assert metrics.counted_seqs.to_json() == {
        "0": [
            {"incarnation": "000000000000000a", "after_seq": 5, "through_seq": 9},
            {"incarnation": "000000000000000b", "after_seq": None, "through_seq": 4},
        ],
        "1": [{"incarnation": "000000000000000c", "after_seq": 0, "through_seq": 0}],
    }


def test_ranges_continue_from_the_state_dir(tmp_path: Path) -> None:
    """A frontend restarted on the same --state-dir continues the saved range of an incarnation it knew."""
    state_dir = StateDir(tmp_path)
    first = FrontendMetrics(state_dir)
    first.observe_message(0, 0xA, 0, "m", load())
    first.observe_message(0, 0xA, 3, "m", load((3, 3)))
    first.save()
    state_dir.close()  # its lock, as the kernel releases it when a frontend dies
    second = FrontendMetrics(StateDir(tmp_path))
    second.observe_message(0, 0xA, 8, "m", load((3, 3), (1, 0)))  # the hello it asked for
    assert second.counted_seqs.to_json() == {
        "0": [{"incarnation": "000000000000000a", "after_seq": 0, "through_seq": 8}]
    }


def test_ranges_per_engine_are_bounded() -> None:
    """An index that restarted more than MAX_RANGES_PER_ENGINE times keeps its newest ranges only."""
    log = CountedSeqsLog()
    for incarnation in range(MAX_RANGES_PER_ENGINE + 2):
        log.observe(0, incarnation, 0, first_sight=False)
    ranges = log.saved()[0]
    assert len(ranges) == MAX_RANGES_PER_ENGINE and ranges[0].incarnation == 2
