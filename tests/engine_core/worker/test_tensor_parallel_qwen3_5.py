"""Two real rank processes joined by gloo run a Qwen3.5 model sharded (Gated DeltaNet heads and their
states split, the full-attention layer as Qwen3's; dense, or MoE with each expert split or whole) and return
the logits of one rank-free model (N = 1) on the same steps: a chunked prefill, a decode, a verification
keeping every token's state, and decodes from the accepted states with a prefix state copied; each rank's
state slots hold the N = 1 states of its heads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.testing.hybrid_rank_steps import HybridRankOutput, hybrid_runner_outputs
from openinfer.engine_core.testing.qwen3_5_checkpoint import Layout, make_tiny_qwen3_5_checkpoint
from openinfer.engine_core.testing.seq_chunks import SeqChunk, step_of_chunks
from openinfer.engine_core.testing.tensor_parallel_ranks import run_ranks
from openinfer.engine_core.worker.parallel.rank_spec import RankSpec
from openinfer.engine_core.worker.step_batch import StepBatch

BLOCK_SIZE = 4
NUM_BLOCKS = 16
ATOL = 1e-4  # float32; the all-reduces add the ranks' partial sums in another order than one matmul does
GROUP = 4  # state slots per request: A's are 0..3, B's 4..7
STATES = StateGeometry(2, GROUP, num_prefix_slots=2, prefix_interval=BLOCK_SIZE)  # 8, 9 prefix; 10 scratch
PROMPT_A = [5, 17, 4, 99, 250, 8, 31]  # 7 tokens: 2 blocks
PROMPT_B = list(range(40, 53))  # 13 tokens, prefilled in two chunks of 6 and 7
TABLE_A, TABLE_B = [9, 2, 5], [14, 0, 7, 11, 3]  # scattered and out of order
# 4 value heads over 2 key heads, 2 query heads over 1 KV head (replicated on both ranks)
SIZES = {"linear_num_key_heads": 2, "linear_num_value_heads": 4}


def kept(step: StepBatch, writes: list[int]) -> StepBatch:
    """``step`` with each token's state kept in the slot ``writes`` names (a verification's)."""
    return replace(step, state_write=np.array(writes, dtype=np.int64))


def hybrid_steps() -> list[StepBatch]:
    a, b = 0, GROUP  # each request's first slot: its state between steps
    return [
        # A's whole prompt with logits at every token; B's first chunk, no logits (mid-prompt)
        step_of_chunks(
            [SeqChunk(PROMPT_A, 0, TABLE_A, 7, a), SeqChunk(PROMPT_B[:6], 0, TABLE_B, 0, b)], BLOCK_SIZE
        ),
        # A decodes one token; B's last chunk (reading its first chunk's state), logits at its last 2
        step_of_chunks(
            [SeqChunk([3], 7, TABLE_A, 1, a), SeqChunk(PROMPT_B[6:], 6, TABLE_B, 2, b)], BLOCK_SIZE
        ),
        # a verification: A 3 tokens, B 2, every token's state kept in its group's slots 0, 1, 2 (the short
        # recurrent form); logits at every token
        kept(
            step_of_chunks(
                [SeqChunk([200, 7, 9], 8, TABLE_A, 3, a), SeqChunk([1, 2], 13, TABLE_B, 2, b)], BLOCK_SIZE
            ),
            [a, a + 1, a + 2, b, b + 1],
        ),
        # A accepted 2 of its 3 (reads slot 1), B 1 of 2 (reads slot 4); then A's state kept as a prefix state
        # in slot 8 and B's in slot 9
        replace(
            step_of_chunks(
                [SeqChunk([11], 10, TABLE_A, 1, a), SeqChunk([12], 14, TABLE_B, 1, b)], BLOCK_SIZE
            ),
            state_read=np.array([a + 1, b], dtype=np.int64),
            state_copies=np.array([[a, 8], [b, 9]], dtype=np.int64),
        ),
        # both decode from the prefix states
        replace(
            step_of_chunks(
                [SeqChunk([13], 11, TABLE_A, 1, a), SeqChunk([14], 15, TABLE_B, 1, b)], BLOCK_SIZE
            ),
            state_read=np.array([8, 9], dtype=np.int64),
        ),
    ]


# each case: a MoE model or dense, whether its ranks split the experts whole, the checkpoint's layout
CASES: dict[str, tuple[bool, bool, Layout]] = {
    "dense": (False, False, "conditional"),  # the released layout: vision tower and MTP head skipped
    # 8 experts of width 32 each split 16 + 16, the shared expert's 32 too; the experts per expert
    "moe": (True, False, "conditional"),
    # 4 experts whole on each rank (--enable-expert-parallel), the shared expert split by width
    "moe_expert_parallel": (True, True, "conditional"),
    # the same from a text-only checkpoint (`model.layers.*` names)
    "moe_expert_parallel_text_only": (True, True, "causal_lm"),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    moe, expert_parallel, layout = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    checkpoint = make_tiny_qwen3_5_checkpoint(folder, seed=4, overrides=SIZES, moe=moe, layout=layout)
    return checkpoint, expert_parallel


@pytest.mark.timeout(180)
def test_two_ranks_give_one_rank_logits_and_states(case: tuple[Path, bool]) -> None:
    """Each of 2 ranks returns the whole logits of every step, equal to the N = 1 runner's within float32
    tolerance, and its conv and recurrent state slots are the N = 1 slots of its channels and heads: the
    states were read, kept per token and copied where the one-rank model keeps them."""
    checkpoint, expert_parallel = case
    args = (checkpoint, hybrid_steps(), NUM_BLOCKS, BLOCK_SIZE, STATES)
    expected = hybrid_runner_outputs(TensorParallel.SINGLE, *args)
    ranks: list[HybridRankOutput] = run_ranks(hybrid_runner_outputs, 2, *args, expert_parallel, timeout_s=150)
    vocab = ModelConfig.from_folder(checkpoint).vocab_size
    assert [logits.shape for logits in expected.logits] == [(7, vocab), (3, vocab), (5, vocab)] + [
        (2, vocab)
    ] * 2
    for rank, output in enumerate(ranks):
        for step, (got, want) in enumerate(zip(output.logits, expected.logits, strict=True)):
            np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"rank {rank}, step {step}")
        for layer, (mine, whole) in enumerate(zip(output.states, expected.states, strict=True)):
            # 1 key head of 2 and 2 value heads of 4 (16 dims each): q, k then v channels of the rank's heads
            assert (mine.k_heads.size, mine.v_heads.size) == (1, 2)
            keys, values = mine.k_heads.scaled(16), mine.v_heads.scaled(16)
            key_dim = 2 * 16
            channels = np.r_[keys.slice, key_dim + keys.start : key_dim + keys.start + keys.size,
                             2 * key_dim + values.start : 2 * key_dim + values.start + values.size]  # fmt: skip
            where = f"rank {rank}, layer {layer}"
            assert np.abs(mine.recurrent[:-1]).max() > 0, where  # every slot but the scratch one was used
            np.testing.assert_allclose(mine.conv, whole.conv[:, channels], rtol=0, atol=ATOL, err_msg=where)
            np.testing.assert_allclose(
                mine.recurrent, whole.recurrent[:, mine.v_heads.slice], rtol=0, atol=ATOL, err_msg=where
            )


def test_a_rank_spec_carries_the_state_geometry() -> None:
    """The driver's state slots reach every rank through its RankSpec's JSON, unchanged."""
    spec = RankSpec(
        engine_index=0, rank=1, world_size=2, init_address="tcp://127.0.0.1:1", parent_pid=1,
        model_path="m", device="cpu", dtype="float32", num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
        attention_backend="torch", enforce_eager=True, max_num_seqs=2, num_threads=1, rank_timeout=30.0,
        log_level="info", state_geometry=STATES,
    )  # fmt: skip
    assert RankSpec.decode(spec.encode()).state_geometry == STATES
