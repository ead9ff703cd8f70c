from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.processes import Cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Cluster]:
    """A frontend and one CPU engine serving the tiny model as "tiny"."""
    c = Cluster(tmp_path_factory.mktemp("logs"))
    try:
        c.start_frontend()
        c.start_engine(tiny_model)
        c.wait_healthy()
        yield c
    finally:
        c.stop()
