"""tools/training.py: what a model card says of how it was made."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from openinfer.tools.training import REPO_ROOT, command_line


def test_command_line_names_nothing_outside_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script is shown relative to the repository, a text outside it by its name only, flags as given."""
    text = tmp_path / "tinyshakespeare.txt"
    text.write_text("to be or not to be")
    script = REPO_ROOT / "tools" / "train_dflash.py"
    monkeypatch.setattr(sys, "argv", [str(script), str(text), "--steps", "5"])
    assert command_line() == "python tools/train_dflash.py tinyshakespeare.txt --steps 5"
