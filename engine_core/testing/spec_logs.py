"""Reading an engine's verification log (``--spec-log``): one JSON object per draft (DESIGN.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_spec_log(path: Path) -> list[dict[str, Any]]:
    """Every line of the spec log at ``path``, in the order the engine wrote them (one per draft)."""
    return [json.loads(line) for line in path.read_text().splitlines()]
