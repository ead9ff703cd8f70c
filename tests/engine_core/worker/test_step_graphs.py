"""Padded fixed-shape steps (the shapes CUDA graphs replay) give the tokens of the unpadded step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openinfer.engine_core.config import DrafterSpec, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.qwen3_moe_checkpoint import make_tiny_moe_checkpoint
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step, step_of_chunks
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.step_graphs import StepGraphs, bucket_for, pad_step, uniform_query_len
from openinfer.protocol import EngineCoreRequest, SamplingParams

SMALL = SMALL_QWEN3
BLOCK_SIZE = 4
NUM_BLOCKS = 48


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target") / "t", seed=3, overrides=SMALL)


def padded(runner: ModelRunner) -> ModelRunner:
    """``runner`` with its decode and verify steps run padded, eagerly (the CPU twin of graph replay)."""
    runner.step_graphs = StepGraphs(
        runner.model, runner.kv_caches, BLOCK_SIZE, NUM_BLOCKS, 256, max_batch=8, capture=False
    )
    return runner


def test_shapes_and_buckets() -> None:
    """Decodes and verifications are uniform (q = the longest, up to its query bucket); a prefill chunk is
    not; batch buckets round up too."""
    decode, verify = SeqChunk([5], 7, [0, 1]), SeqChunk([5, 6, 7], 3, [2, 4], num_logits=3)
    assert uniform_query_len(step_of_chunks([decode, verify], BLOCK_SIZE)) == 4  # 3 tokens: the bucket of 4
    assert uniform_query_len(step_of_chunks([SeqChunk([5, 6], 0, [3], num_logits=1)], BLOCK_SIZE)) is None
    assert [bucket_for(n, 64) for n in (1, 3, 5, 9, 64, 65)] == [1, 4, 8, 16, 64, None]


def test_padding_writes_only_the_scratch_block() -> None:
    """A 1-token request padded to q = 3 writes its own slot, then two scratch slots; a padding request
    writes scratch slots only; real queries' contexts end where they did (seq_len = start + q, causal)."""
    step = pad_step(step_of_chunks([SeqChunk([9], 5, [2, 7])], 4), batch=2, query_len=3, scratch_block=10)
    assert step.slot_mapping.ravel().tolist() == [
        7 * 4 + 1,
        40,
        40,
        40,
        41,
        42,
    ]  # position 5: block 7, offset 1
    assert step.positions.ravel().tolist() == [5, 5, 5, 0, 1, 2]
    assert step.seq_lens.tolist() == [8, 3] and step.logits_rows.tolist() == [0]
    assert step.block_tables.tolist() == [[2, 7], [10, 10]]  # the 2 columns positions 0..7 need


@pytest.fixture(scope="module")
def moe_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_moe_checkpoint(tmp_path_factory.mktemp("moe") / "t", seed=3)


@pytest.mark.parametrize(
    ("model", "backend"), [("target", "torch"), ("target", "triton"), ("moe_target", "torch")]
)
def test_padded_steps_give_the_same_logits(model: str, backend: str, request: pytest.FixtureRequest) -> None:
    """Prefill three prompts, then decode and verify-shaped steps of mixed lengths: the padded path's
    logits and aux hidden states equal the eager path's, and the real KV blocks end up the same. With the
    Triton kernels (under the interpreter on the CPU) the padded step is the one graphs replay on CUDA; on
    a Qwen3-MoE target the padding tokens are routed to experts too, and must change no real token's output."""
    target: Path = request.getfixturevalue(model)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    eager = ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE, torch.float32, "torch", enforce_eager=True)
    pad = padded(
        ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE, torch.float32, backend, enforce_eager=True)
    )
    prompts = [list(range(3, 12)), [40, 41], list(range(100, 117))]
    tables = [[0, 1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]]
    prefill = [SeqChunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)]
    for runner in (eager, pad):
        runner.execute(chunk_step(prefill, runner))  # not uniform: eager on both
    steps = [
        [SeqChunk([7], 9, tables[0]), SeqChunk([8], 2, tables[1]), SeqChunk([9], 17, tables[2])],  # decode
        [
            SeqChunk([1, 2, 3], 10, tables[0], 3),
            SeqChunk([4], 3, tables[1]),
            SeqChunk([5, 6], 18, tables[2], 2),
        ],
    ]
    for chunks in steps:
        expected, got = (
            eager.execute(chunk_step(chunks, eager), [0, 1]),
            pad.execute(chunk_step(chunks, pad), [0, 1]),
        )
        assert expected.aux is not None and got.aux is not None
        torch.testing.assert_close(got.aux, expected.aux, atol=1e-5, rtol=1e-5)
        expected, got = expected.logits, got.logits
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()
    for eager_cache, pad_cache in zip(eager.kv_caches, pad.kv_caches, strict=True):
        torch.testing.assert_close(
            pad_cache[:, :NUM_BLOCKS], eager_cache[:, :NUM_BLOCKS], atol=1e-5, rtol=1e-5
        )


def run_core(target: Path, runner: ModelRunner, spec: DrafterSpec | None) -> list[list[int]]:
    config = EngineConfig(
        model_path=target,
        served_model_name="t",
        num_kv_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        speculative=spec,
    )
    core = EngineCore(config, runner)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], list(range(30, 41)), [9, 9, 9, 9]]
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    out: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while core.has_work:
        for output in core.step():
            out[output.request_id] += output.new_token_ids
    return [out[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("method", [None, "ngram", "dflash"])
def test_engine_tokens_are_the_same_padded(target: Path, tmp_path: Path, method: str | None) -> None:
    """Greedy outputs through the engine core, with no drafter, n-gram and DFlash (which reads aux hidden
    states), are the same with padded steps as without."""
    spec = None
    if method == "ngram":
        spec = DrafterSpec("ngram", 3)
    elif method == "dflash":
        draft = make_tiny_dflash_checkpoint(
            tmp_path / "d", target, seed=1, block_size=4, target_layer_ids=(0,)
        )
        spec = DrafterSpec("dflash", 3, draft)
    device = torch.device("cpu")
    expected = run_core(target, ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE), spec)
    runner = padded(ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE))
    got = run_core(target, runner, spec)
    assert got == expected
    assert runner.step_graphs is not None and runner.step_graphs.num_runs >= 10  # most steps ran padded


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replay_gives_eager_tokens(target: Path) -> None:
    """On CUDA (Triton attention): the captured graphs give the eager tokens, with and without n-gram."""
    device = torch.device("cuda")
    for spec in (None, DrafterSpec("ngram", 3)):
        eager = run_core(
            target,
            ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE, torch.float32, enforce_eager=True),
            spec,
        )
        runner = ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE, torch.float32)  # no bf16 near-ties
        assert runner.step_graphs is not None and runner.step_graphs.capture
        assert run_core(target, runner, spec) == eager
