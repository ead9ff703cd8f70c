"""Two real rank processes joined by gloo run a Qwen3-MoE model sharded, each expert split by its width or
(expert parallelism) each rank holding half the experts whole, and return the logits of the rank-free model
(N = 1) on the same steps as the dense test: a chunked prefill, then decode steps over the sharded KV cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.process.engine_args import config_from_args, parse_args
from openinfer.engine_core.testing.qwen3_moe_checkpoint import make_tiny_moe_checkpoint
from openinfer.engine_core.testing.seq_chunks import SeqChunk
from openinfer.engine_core.testing.tensor_parallel_ranks import run_ranks, runner_logits
from openinfer.engine_core.worker.parallel.rank_spec import RankSpec

BLOCK_SIZE = 4
NUM_BLOCKS = 16
ATOL = 1e-4  # float32; the all-reduce adds the ranks' partial sums in another order than one rank does
PROMPT_A = [5, 17, 4, 99, 250, 8, 31]  # 7 tokens: 2 blocks
PROMPT_B = list(range(40, 53))  # 13 tokens: 4 blocks, prefilled in two chunks of 6 and 7
TABLE_A, TABLE_B = [9, 2], [14, 0, 7, 11]  # scattered and out of order
STEPS = [  # the dense test's steps (test_tensor_parallel_runner.py)
    # A's whole prompt with logits at every token; B's first chunk, no logits (mid-prompt)
    [SeqChunk(PROMPT_A, 0, TABLE_A, len(PROMPT_A)), SeqChunk(PROMPT_B[:6], 0, TABLE_B, 0)],
    # A decodes one token; B's last chunk with logits at its last 2 tokens
    [SeqChunk([3], 7, TABLE_A, 1), SeqChunk(PROMPT_B[6:], 6, TABLE_B, 2)],
    # both decode: A at 8 tokens (its second block's end), B at 13
    [SeqChunk([200], 8, TABLE_A + [5], 1), SeqChunk([1], 13, TABLE_B, 1)],
]

# a small MoE model of each layout, built in a folder, and whether its ranks split the experts whole
CASES: dict[str, tuple[Callable[[Path], Path], bool]] = {
    # 8 experts of width 32, each split 16 + 16; layer 0 a dense MLP (split like Qwen3's), layer 1 sparse
    "tensor_parallel": (
        lambda folder: make_tiny_moe_checkpoint(folder, seed=5, overrides={"mlp_only_layers": [0]}),
        False,
    ),
    # experts 0..3 on rank 0, 4..7 on rank 1; both layers sparse, experts per expert as released
    "expert_parallel": (lambda folder: make_tiny_moe_checkpoint(folder, seed=5), True),
    # the same split read from transformers 5's stacked tensors, the LM head untied (vocab-parallel)
    "expert_parallel_stacked": (
        lambda folder: make_tiny_moe_checkpoint(
            folder, seed=5, stacked_experts=True, overrides={"tie_word_embeddings": False}
        ),
        True,
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    build, expert_parallel = CASES[request.param]
    return build(tmp_path_factory.mktemp(request.param)), expert_parallel


@pytest.mark.timeout(180)
def test_two_moe_ranks_give_one_rank_logits(case: tuple[Path, bool]) -> None:
    """Each of 2 ranks returns the whole (n, vocab) logits of every step, equal to the N = 1 runner's within
    float32 tolerance: every rank routed every token alike, and one all-reduce per MoE block added the
    ranks' experts (or slices of them)."""
    checkpoint, expert_parallel = case
    expected = runner_logits(TensorParallel.SINGLE, checkpoint, STEPS, NUM_BLOCKS, BLOCK_SIZE)
    ranks = run_ranks(
        runner_logits, 2, checkpoint, STEPS, NUM_BLOCKS, BLOCK_SIZE, expert_parallel, timeout_s=150
    )
    vocab = ModelConfig.from_folder(checkpoint).vocab_size
    assert [logits.shape for logits in expected] == [(7, vocab), (3, vocab), (2, vocab)]
    for rank, steps in enumerate(ranks):
        for step, (got, want) in enumerate(zip(steps, expected, strict=True)):
            np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"rank {rank}, step {step}")


def test_the_flag_reaches_the_ranks_spec() -> None:
    """--enable-expert-parallel (vLLM's flag, off by default) is EngineConfig.enable_expert_parallel, and a
    rank's RankSpec carries it through its JSON (what rank_worker.py builds its TensorParallel from)."""
    assert not config_from_args(parse_args(["-tp", "2"])).enable_expert_parallel
    assert config_from_args(parse_args(["-tp", "2", "--enable-expert-parallel"])).enable_expert_parallel
    spec = RankSpec(
        0, 1, 2, "tcp://127.0.0.1:1", 1, "/m", "cpu", "float32", 8, 4, "torch", False, 8, 1, 60.0, "info",
        enable_expert_parallel=True,
    )  # fmt: skip
    assert RankSpec.decode(spec.encode()).enable_expert_parallel
