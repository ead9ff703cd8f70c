"""The Triton paged-attention kernels against the torch backend: on CUDA when present, otherwise on the CPU
under TRITON_INTERPRET=1 (tests/conftest.py). The interpreter is numpy: cases stay tiny."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.kernels.attention import TorchAttentionBackend
from openinfer.kernels.attention_backend import write_kv_cache
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.backend_name import BackendName
from openinfer.kernels.kernel_backends import select_backend
from openinfer.kernels.triton_attention import TritonAttentionBackend, write_kv_cache_triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Output tolerance against the torch backend run in float32 on the same values: the kernels accumulate in
# float32, so what is left is the output's rounding to its dtype (and, on CUDA, P's rounding before P @ V).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
HEADS = [(2, 2), (8, 2)]  # (num_heads, num_kv_heads): GQA ratios 1 and 4
# (context_len, query_len) per request.
DECODES = [(0, 1), (15, 1), (100, 1), (37, 1)]  # a length-1 context; 16 keys = one full block of 16
MIXED = [
    (0, 37),  # a fresh prefill
    (40, 25),  # a prefill chunk after an existing context
    (9, 1),  # a decode inside a mixed step
    (90, 8),  # verification: K + 1 = 8 queries at the end of a long context
    (0, 1),  # a length-1 context
    (24, 8),  # ends at 32 keys: exactly two blocks of 16, one of 32
]


@dataclass(frozen=True)
class Step:
    """One layer's inputs for a step over a cache whose other slots hold random earlier context."""

    q: Tensor  # (num_tokens, num_heads, head_dim)
    k: Tensor  # (num_tokens, num_kv_heads, head_dim)
    v: Tensor
    kv_cache: Tensor  # (2, num_blocks, block_size, num_kv_heads, head_dim)
    meta: AttentionMetadata


def make_step(
    requests: list[tuple[int, int]],
    heads: tuple[int, int],
    head_dim: int,
    dtype: torch.dtype,
    block_size: int = 16,
    seed: int = 0,
) -> Step:
    """Random q/k/v and cache contents; each request's blocks are the next ones of a shuffled pool, so
    tables are scattered and out of order (3 spare blocks stay unused)."""
    g = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads = heads
    sizes = [-(-(c + q) // block_size) for c, q in requests]
    pool = torch.randperm(sum(sizes) + 3, generator=g).tolist()
    tables = [pool[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(len(sizes))]
    meta = AttentionMetadata.build(
        [c for c, _ in requests], [q for _, q in requests], tables, block_size, DEVICE
    )
    # q, k and v as views into one packed projection, strided like the model's
    qkv = torch.randn(meta.num_tokens, num_heads + 2 * num_kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    q, k, v = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    cache = torch.randn(2, len(pool), block_size, num_kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    return Step(q, k, v, cache, meta)


def check_against_torch(step: Step, backend: TritonAttentionBackend, dtype: torch.dtype) -> None:
    """Triton's output equals the torch backend's (in float32, same values) to the dtype's tolerance, and
    the cache it leaves is bit for bit the one write_kv_cache leaves."""
    head_dim = step.q.shape[-1]
    expected_cache = step.kv_cache.clone()
    write_kv_cache(expected_cache, step.k, step.v, step.meta.slot_mapping)
    expected = select_backend(DEVICE, BackendName.TORCH).forward(
        step.q.float(), step.k.float(), step.v.float(), step.kv_cache.float(), step.meta, head_dim**-0.5
    )
    out = backend.forward(step.q, step.k, step.v, step.kv_cache, step.meta, head_dim**-0.5)
    assert out.shape == step.q.shape and out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)
    assert torch.equal(step.kv_cache, expected_cache)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", HEADS, ids=["mha", "gqa4"])
def test_triton_decode_matches_torch(heads: tuple[int, int], head_dim: int, dtype: torch.dtype) -> None:
    """Decode steps (one query per request, split-KV) over ragged contexts agree with the torch backend."""
    check_against_torch(make_step(DECODES, heads, head_dim, dtype), TritonAttentionBackend(), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", HEADS, ids=["mha", "gqa4"])
def test_triton_varlen_matches_torch(heads: tuple[int, int], head_dim: int, dtype: torch.dtype) -> None:
    """Mixed steps (prefill, chunk after context, verification, decodes) agree with the torch backend."""
    check_against_torch(make_step(MIXED, heads, head_dim, dtype), TritonAttentionBackend(), dtype)


@pytest.mark.parametrize("block_size", [32, 12])
@pytest.mark.parametrize("requests", [DECODES, MIXED], ids=["decode", "varlen"])
def test_triton_other_block_sizes(requests: list[tuple[int, int]], block_size: int) -> None:
    """Blocks of 32 tokens, and of 12 (not a power of two; the engine accepts any --block-size)."""
    step = make_step(requests, (8, 2), 64, torch.float32, block_size=block_size, seed=1)
    check_against_torch(step, TritonAttentionBackend(), torch.float32)


@pytest.mark.parametrize("num_kv_splits", [1, 2, 8])
def test_triton_decode_splits_long_context(num_kv_splits: int) -> None:
    """A 300-token context next to a 5-token one: one split (no combine), two splits of 5 key tiles of 32
    each, and 8 splits of which the short request leaves 7 empty, all give the same attention."""
    step = make_step([(299, 1), (4, 1)], (4, 2), 64, torch.float32, seed=2)
    check_against_torch(step, TritonAttentionBackend(num_kv_splits), torch.float32)


def test_triton_varlen_several_query_tiles() -> None:
    """A 70-token prefill without GQA spans two 64-query tiles; with a context of 30 tokens before it."""
    step = make_step([(30, 70), (0, 3)], (2, 2), 64, torch.float32, seed=3)
    check_against_torch(step, TritonAttentionBackend(), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triton_kv_write_is_bit_exact(dtype: torch.dtype) -> None:
    """The write kernel stores strided k/v views at their slots exactly as write_kv_cache does, and touches
    no other slot."""
    step = make_step(MIXED, (4, 2), 64, dtype, seed=4)
    expected = step.kv_cache.clone()
    write_kv_cache(expected, step.k, step.v, step.meta.slot_mapping)
    write_kv_cache_triton(step.kv_cache, step.k, step.v, step.meta.slot_mapping)
    assert torch.equal(step.kv_cache, expected)


def test_triton_is_selected() -> None:
    """auto picks Triton on CUDA (torch on the CPU); "triton" is refused on the CPU without the interpreter."""
    expected = TritonAttentionBackend if DEVICE.type == "cuda" else TorchAttentionBackend
    assert isinstance(select_backend(DEVICE), expected)
    assert isinstance(select_backend(DEVICE, "triton"), TritonAttentionBackend)
    if DEVICE.type == "cpu":
        os.environ.pop("TRITON_INTERPRET")
        try:
            with pytest.raises(ValueError, match="needs a CUDA device"):
                select_backend(DEVICE, "triton")
        finally:
            os.environ["TRITON_INTERPRET"] = "1"


def test_cpu_engine_never_imports_triton() -> None:
    """Importing the attention module and running the built-in model on the CPU (auto backend) import neither
    the Triton kernels nor triton itself (unless torch's own import already did)."""
    script = (
        "import sys, torch\n"
        "imported_by_torch = 'triton' in sys.modules\n"
        "from openinfer.engine_core.builtin_model import builtin_target_folder\n"
        "from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step\n"
        "from openinfer.engine_core.worker.model_runner import ModelRunner\n"
        "runner = ModelRunner(builtin_target_folder(), torch.device('cpu'), num_kv_blocks=4)\n"
        "runner.execute(chunk_step([SeqChunk([5, 6, 7], 0, [0], 1)], runner))\n"
        "assert 'openinfer.kernels.triton_attention' not in sys.modules\n"
        "assert imported_by_torch or 'triton' not in sys.modules, 'triton was imported'\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)


def test_triton_qwen3_logits_match_torch_backend() -> None:
    """The built-in Qwen3 (GQA 4:2, head_dim 64) through ModelRunner gives the torch backend's logits with the
    Triton backend: a ragged batched prefill, a decode step, then a 4-token verification-shaped step."""
    runners = [
        ModelRunner(builtin_target_folder(), DEVICE, 16, 16, torch.float32, name)
        for name in ("torch", "triton")
    ]
    assert isinstance(runners[1].attn_backend, TritonAttentionBackend)
    prompts = [list(range(3, 40)), [9], list(range(100, 117))]  # 37 tokens, 1, 17 (past one block of 16)
    tables = [[4, 1, 7], [0], [12, 3]]  # scattered, out of order
    steps = [
        [SeqChunk(p, 0, t, len(p)) for p, t in zip(prompts, tables, strict=True)],
        [SeqChunk([11], len(p), t, 1) for p, t in zip(prompts, tables, strict=True)],
        [SeqChunk([12, 13, 14, 15], len(p) + 1, t, 4) for p, t in zip(prompts, tables, strict=True)],
    ]
    for chunks in steps:
        expected, got = (runner.execute(chunk_step(chunks, runner)).logits for runner in runners)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
