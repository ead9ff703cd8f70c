"""Invariant 1 at N = 2: greedy tokens of two gloo ranks running a sharded model are transformers' greedy
tokens (teacher-forced, float near-ties aside) and one rank's, on Qwen3 dense with Qwen3's real 151,936-token
vocabulary, Qwen3-MoE (each expert split by width, and whole experts under expert parallelism) and Qwen3.5
(dense and MoE)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from openinfer.engine_core.testing.qwen3_5_checkpoint import load_hf_text_model, make_tiny_qwen3_5_checkpoint
from openinfer.engine_core.testing.qwen3_checkpoint import (
    SMALL_REAL_VOCAB_WIDTHS,
    make_qwen3_0_6b_shaped_checkpoint,
)
from openinfer.engine_core.testing.qwen3_moe_checkpoint import make_tiny_moe_checkpoint
from openinfer.engine_core.testing.tensor_parallel_ranks import run_ranks, runner_greedy

PROMPTS = [[5, 17, 4, 99, 250, 8, 31], list(range(40, 53)), [7, 7, 7, 3]]
MAX_TOKENS = 8


@dataclass(frozen=True)
class Case:
    """A checkpoint builder, whether its experts go whole to the ranks, and how transformers loads it."""

    build: Callable[[Path], Path]
    expert_parallel: bool = False
    load: Callable[[Path], Any] | None = None


CASES = {
    "qwen3-real-vocab": Case(lambda f: make_qwen3_0_6b_shaped_checkpoint(f, widths=SMALL_REAL_VOCAB_WIDTHS)),
    "qwen3-moe": Case(lambda f: make_tiny_moe_checkpoint(f, seed=4)),
    "qwen3-moe-expert-parallel": Case(lambda f: make_tiny_moe_checkpoint(f, seed=4), expert_parallel=True),
    "qwen3.5": Case(lambda f: make_tiny_qwen3_5_checkpoint(f, seed=3), load=load_hf_text_model),
    "qwen3.5-moe": Case(lambda f: make_tiny_qwen3_5_checkpoint(f, seed=3, moe=True), load=load_hf_text_model),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_two_ranks_decode_transformers_greedy_tokens(tmp_path: Path, case: Case) -> None:
    """3 prompts in one batch, 8 greedy tokens each, on two ranks: both ranks take the same tokens, which are
    one rank's and transformers' (teacher-forced)."""
    folder = case.build(tmp_path / "model")
    args = (folder, PROMPTS, MAX_TOKENS, 4, case.expert_parallel)
    one = run_ranks(runner_greedy, 1, *args)[0]
    rank0, rank1 = run_ranks(runner_greedy, 2, *args)
    assert rank0 == rank1 == one
    assert sum(len(set(o)) for o in one) > len(PROMPTS) * 2  # not one repeated token per request
    assert_hf_greedy(folder, PROMPTS, rank0, case.load)
