"""benchmarks/tensor_parallel_step.py at toy sizes: two gloo ranks and the one-rank runner time the same rows,
and the table has its shape (no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer.benchmarks.tensor_parallel_step import COLUMNS, main
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint


@pytest.mark.timeout(120)
def test_prints_one_row_per_step_and_every_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A row each for decode b1, decode b8 and the prefill, each with every column and the ring bytes of a
    2-layer model's collectives (the script checks them against what its wrapper counted)."""
    folder = make_tiny_checkpoint(tmp_path / "model", seed=2, overrides=SMALL_QWEN3)
    flags = ["--rounds", "1", "--iters", "1", "--warmup", "0", "--context-len", "8", "--prefill-len", "20"]
    main(["--model", str(folder), *flags, "--timeout-s", "90"])
    lines = capsys.readouterr().out.splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == "| step | " + " | ".join(COLUMNS) + " |"
    rows = [line.removeprefix("| ").removesuffix(" |").split(" | ") for line in table[2:]]
    assert [row[0] for row in rows] == ["decode b1", "decode b8", "prefill 20"]
    assert all(len(row) == len(COLUMNS) + 1 for row in rows)
    # hidden 64, vocab 256, float32: 5 all-reduces of (tokens, 64) (at 2 ranks a ring sends each whole) and
    # half of each logits row (128 * 4 bytes): 5 * 256 + 512, 5 * 8 * 256 + 8 * 512, 5 * 20 * 256 + 512
    assert [row[-1] for row in rows] == ["1,792", "14,336", "26,112"]
    assert any(line.startswith("On paper") for line in lines)
