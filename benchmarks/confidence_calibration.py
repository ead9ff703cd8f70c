"""How well a DSpark drafter's confidence head predicts what the target accepts, from the engines' spec logs:
per draft position, over the verified drafts whose earlier drafts were all accepted (the drafts that reached
it), the mean confidence against the fraction accepted (the head estimates that conditional acceptance).

Serve with every draft verified, so that no position is chosen by the confidences it measures, then read the
spec logs the sweep kept:

    openinfer-bench sweep --drafters dspark:K=7 --temperature 0.8 --log-dir runs/calibration ...
    python benchmarks/confidence_calibration.py runs/calibration/*/spec-logs/*.jsonl

(the sweep passes `--no-enable-adaptive-verification` to a drafter named without `:adaptive`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from openinfer.protocol.counters import CONFIDENCE_SCALE
from openinfer.protocol.spec_log import parse_spec_log_line


@dataclass
class Calibration:
    """Per position: drafts that reached it, their confidence sum, and how many were accepted."""

    reached: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    rounds: int = 0
    accepted_total: int = 0

    def add(self, micros: list[int], num_accepted: int) -> None:
        """One verified draft with its confidences: positions 0..num_accepted were reached (past the draft's
        end: none), positions below num_accepted accepted."""
        self.rounds += 1
        self.accepted_total += num_accepted
        for i, m in enumerate(micros[: num_accepted + 1]):
            if i == len(self.reached):  # the first draft to reach position i
                self.reached.append(0)
                self.confidence.append(0.0)
                self.accepted.append(0)
            self.reached[i] += 1
            self.confidence[i] += m / CONFIDENCE_SCALE
            self.accepted[i] += num_accepted > i

    def table(self) -> str:
        lines = [
            f"{self.rounds} drafts with confidences, {self.accepted_total / max(self.rounds, 1):.3f} accepted "
            "on average",
            "",
            "| position | drafts reaching it | mean confidence | accepted |",
            "|---:|---:|---:|---:|",
        ]
        for i, reached in enumerate(self.reached):
            lines.append(
                f"| {i} | {reached} | {self.confidence[i] / reached:.3f} | {self.accepted[i] / reached:.3f} |"
            )
        return "\n".join(lines)


def calibration(paths: list[Path]) -> Calibration:
    """The calibration of every draft with confidences in the spec logs at `paths`."""
    result = Calibration()
    for path in paths:
        for line in path.read_text().splitlines():
            draft = parse_spec_log_line(line)
            if draft.confidence_micros:
                result.add(draft.confidence_micros, draft.num_accepted)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("spec_logs", type=Path, nargs="+", help="spec-log files (JSON lines)")
    print(calibration(parser.parse_args().spec_logs).table())


if __name__ == "__main__":
    main()
