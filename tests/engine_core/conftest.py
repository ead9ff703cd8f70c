"""Fixtures shared by the engine-core tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer.engine_core.testing.dflash_checkpoint import make_accepting_dflash_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A target that tends to repeat and a near-identity DFlash drafter: many drafts are accepted, so what a
    test checks acts at accepted draft positions. (target folder, drafter folder), built once per module."""
    return make_accepting_dflash_pair(tmp_path_factory.mktemp("pair"))
