"""benchmarks/confidence_calibration.py reads spec logs: per position, the drafts that reached it (every
earlier draft accepted), their mean confidence and the share accepted; rounds without confidences and
positions past a draft's accepted run plus one are not counted."""

from __future__ import annotations

import json
from pathlib import Path

from openinfer.benchmarks.confidence_calibration import calibration


def line(num_draft_tokens: int, num_accepted: int, micros: list[int]) -> str:
    return json.dumps(
        {
            "time": 1.0,
            "engine_index": 0,
            "incarnation": "0" * 16,
            "request_id": "r",
            "num_spec_tokens": 4,
            "num_draft_tokens": num_draft_tokens,
            "num_accepted": num_accepted,
            "confidence_micros": micros,
        }
    )


def test_positions_count_the_drafts_that_reached_them(tmp_path: Path) -> None:
    """Three rounds: 4 drafts, 2 accepted (positions 0-2 reached, 0-1 accepted); 3 drafts, none accepted
    (position 0 reached); 4 drafts all accepted; and a round without confidences (an n-gram drafter's)."""
    log = tmp_path / "spec.jsonl"
    rounds = [
        line(4, 2, [900_000, 800_000, 500_000, 100_000]),
        line(3, 0, [300_000, 200_000, 100_000]),
        line(4, 4, [600_000, 600_000, 600_000, 600_000]),
        line(2, 1, []),
    ]
    log.write_text("\n".join(rounds) + "\n")
    got = calibration([log])
    assert got.rounds == 3 and got.accepted_total == 6
    assert got.reached == [3, 2, 2, 1] and got.accepted == [2, 2, 1, 1]
    assert [round(c, 6) for c in got.confidence] == [1.8, 1.4, 1.1, 0.6]  # 0.9 + 0.3 + 0.6, ...
    assert "| 0 | 3 | 0.600 | 0.667 |" in got.table()
