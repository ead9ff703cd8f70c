"""Two real rank processes joined by gloo run a Qwen3 dense model sharded (tensor parallelism, N = 2) and
return the logits of one rank-free model (N = 1) on the same steps: a chunked prefill, then decode steps that
read the sharded KV cache back."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.testing.qwen3_checkpoint import (
    SMALL_REAL_VOCAB_WIDTHS,
    make_qwen3_0_6b_shaped_checkpoint,
)
from openinfer.engine_core.testing.seq_chunks import SeqChunk
from openinfer.engine_core.testing.tensor_parallel_ranks import run_ranks, runner_logits
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint

BLOCK_SIZE = 4
NUM_BLOCKS = 16
ATOL = 1e-4  # float32; the all-reduces add the ranks' partial sums in another order than one matmul does
PROMPT_A = [5, 17, 4, 99, 250, 8, 31]  # 7 tokens: 2 blocks
PROMPT_B = list(range(40, 53))  # 13 tokens: 4 blocks, prefilled in two chunks of 6 and 7
# (request A's blocks, request B's), scattered and out of order
TABLE_A, TABLE_B = [9, 2], [14, 0, 7, 11]
STEPS = [
    # A's whole prompt with logits at every token; B's first chunk, no logits (mid-prompt)
    [SeqChunk(PROMPT_A, 0, TABLE_A, len(PROMPT_A)), SeqChunk(PROMPT_B[:6], 0, TABLE_B, 0)],
    # A decodes one token; B's last chunk with logits at its last 2 tokens
    [SeqChunk([3], 7, TABLE_A, 1), SeqChunk(PROMPT_B[6:], 6, TABLE_B, 2)],
    # both decode: A at 8 tokens (its second block's end), B at 13
    [SeqChunk([200], 8, TABLE_A + [5], 1), SeqChunk([1], 13, TABLE_B, 1)],
]
# a small model of each layout N = 2 shards differently, built in a folder
CASES: dict[str, Callable[[Path], Path]] = {
    # 4 query heads over 2 KV heads: one KV head a rank
    "tied": lambda folder: make_tiny_checkpoint(folder, seed=2, overrides=SMALL_QWEN3),
    # the LM head its own vocab-parallel matrix
    "untied": lambda folder: make_tiny_checkpoint(
        folder, seed=2, tie_word_embeddings=False, overrides=SMALL_QWEN3
    ),
    # the one KV head replicated on both ranks
    "one_kv_head": lambda folder: make_tiny_checkpoint(
        folder, seed=2, overrides={**SMALL_QWEN3, "num_key_value_heads": 1}
    ),
    # Qwen3's 151,936-row vocabulary, bf16 weights in 2 files with an index: slices read across files
    "real_vocab": lambda folder: make_qwen3_0_6b_shaped_checkpoint(folder, widths=SMALL_REAL_VOCAB_WIDTHS),
}


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return CASES[request.param](tmp_path_factory.mktemp(request.param))


@pytest.mark.timeout(180)
def test_two_ranks_give_one_rank_logits(checkpoint: Path) -> None:
    """Each of 2 ranks returns the whole (n, vocab) logits of every step, equal to the N = 1 runner's within
    float32 tolerance: the sharded prefill wrote each rank's KV heads where the decode steps read them."""
    expected = runner_logits(TensorParallel.SINGLE, checkpoint, STEPS, NUM_BLOCKS, BLOCK_SIZE)
    ranks = run_ranks(runner_logits, 2, checkpoint, STEPS, NUM_BLOCKS, BLOCK_SIZE, timeout_s=150)
    vocab = ModelConfig.from_folder(checkpoint).vocab_size
    assert [logits.shape for logits in expected] == [(7, vocab), (3, vocab), (2, vocab)]
    for rank, steps in enumerate(ranks):
        for step, (got, want) in enumerate(zip(steps, expected, strict=True)):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"rank {rank}, step {step}")


def test_a_failing_rank_is_reported_and_every_child_ends() -> None:
    """A rank that raises (here: a model folder that does not exist) fails the run with its traceback,
    within the bound, and leaves no child process behind."""
    with pytest.raises(RuntimeError, match="rank [01] of 2 failed"):
        run_ranks(runner_logits, 2, Path("/nonexistent"), STEPS, NUM_BLOCKS, BLOCK_SIZE, timeout_s=60)
    assert multiprocessing.active_children() == []
