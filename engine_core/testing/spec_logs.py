"""Reading an engine's verification log (``--spec-log``): one JSON object per round (docs/design.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openinfer.protocol import SpecDecodeCounters
from openinfer.protocol.spec_log import parse_spec_log_line


def read_spec_log(path: Path) -> list[dict[str, Any]]:
    """Every line of the spec log at ``path``, in the order the engine wrote them (one per round: a draft,
    or a round with ``num_draft_tokens`` 0 whose proposal went unverified)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def spec_log_counters(lines: list[dict[str, Any]], num_spec_tokens: int) -> SpecDecodeCounters:
    """The counters of K = ``num_spec_tokens`` that these lines make, each counted by the same ``observe_*``
    call the engine made: equal to the engine's counters over the same rounds, every field."""
    counters = SpecDecodeCounters.zero(num_spec_tokens)
    for line in lines:
        parse_spec_log_line(json.dumps(line)).observe_into(counters)
    return counters
