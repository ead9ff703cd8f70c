"""openinfer-serve on a checkpoint that cannot load: the engine says why and exits 2, and serve stops at once
with exit 1 instead of starting it again until --startup-timeout."""

from __future__ import annotations

from pathlib import Path

from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint
from tests.e2e.processes import Cluster


def test_serve_on_a_truncated_checkpoint_stops_with_the_engines_message(tmp_path: Path) -> None:
    """A model.safetensors cut in half: serve's output holds the engine's message naming the file, the
    engine is not started again, and serve exits 1 long before its --startup-timeout of an hour (the wait
    is bounded at 4 minutes; it takes seconds)."""
    folder = make_tiny_checkpoint(tmp_path / "model", overrides=SMALL_QWEN3)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    cluster = Cluster(tmp_path / "logs")
    try:
        serve = cluster.start_serve(folder, "--startup-timeout", "3600")
        assert serve.wait(240) == 1  # below pytest-timeout's 300 s, so that this bound reports
        log = (tmp_path / "logs" / "serve.log").read_text(errors="replace")
        assert f"{weights} is not a valid safetensors file" in log, log
        assert "engine 0 exited with code 2: its flags or its model are wrong" in log, log
        assert "starting it again" not in log, log
    finally:
        cluster.stop(30)
