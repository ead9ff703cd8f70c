"""Matmuls by a fixed weight on the CPU through oneDNN, with the weight packed once into oneDNN's blocked
layout (as vLLM's CPU build does for every dense projection and the LM head).

Why: on a decode step's few rows MKL's sgemm by a plain (in, out) matrix runs far below the memory bandwidth
once there is more than one row, and a prefill chunk's GEMM far below the core's FLOPs. Measured on one AVX-512
core (float32, `benchmarks/cpu_matmul.py`): the 151,936 x 1024 LM head at 8 rows 47-53 ms packed against
93-139 ms plain; a 6,144 x 1024 projection at 512 rows 61 ms against 97 ms.

At one row it depends on the CPU: on that AVX-512 core the plain row-major matrix was as fast or faster (a
layer's projections 3.2 ms against 4.1 packed); on an AVX2 AMD EPYC core the packed one reads at the memory
bandwidth and the plain one 1.3-1.6x slower (the LM head 15.8 ms against 21.0). So the first packing in a
process times one row both ways, over a matrix too large for the cache, and every `PackedWeight` of that
dtype carries the answer (`min_rows`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

# oneDNN blocks the packed weight for this many rows (vLLM's choice too); any row count runs on it.
_PACKED_FOR_ROWS = 32
# The one-row probe's matrix: (1024, 16,384) float32 = 64 MiB, beyond a CPU's cache, so it times the
# memory path a decode step's weights take.
_PROBE_SHAPE = (1024, 16_384)
_PROBE_ROUNDS = 3


@dataclass(frozen=True)
class PackedWeight:
    """A weight in oneDNN's blocked layout (an opaque tensor only `packed_matmul` reads), and the fewest rows
    it is used for: 1 where this CPU multiplies one row faster by it than by the plain matrix, else 2."""

    matrix: Tensor
    min_rows: int


def cpu_packing_available(dtype: torch.dtype) -> bool:
    """Whether this torch build and CPU run oneDNN matmuls in `dtype` (float32 always with oneDNN; bfloat16
    where oneDNN reports bf16 support: native with avx512_bf16 or AMX, emulated on plain AVX-512, where
    every bfloat16 matmul is slow, packed or not: docs/benchmarks.md)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack_weight(weight: Tensor) -> PackedWeight:
    """(out_features, in_features) CPU weight -> the same matrix packed by oneDNN, for the row counts this
    CPU multiplies faster that way. A strided view (a transposed parameter) is read as it is."""
    matrix = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACKED_FOR_ROWS)
    return PackedWeight(matrix, 1 if one_row_faster_packed(weight.dtype) else 2)


def packed_matmul(x: Tensor, packed: Tensor, bias: Tensor | None = None) -> Tensor:
    """(n, in_features) @ packed.T (+ bias) -> (n, out_features), x's dtype, a plain contiguous tensor."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


def weight_matmul(
    x: Tensor, weight_t: Tensor, packed: PackedWeight | None, bias: Tensor | None = None
) -> Tensor:
    """(n, in_features) @ weight_t (in_features, out_features) (+ bias): by the oneDNN-packed copy of the
    same weight when there is one and n reaches its `min_rows`, else by weight_t itself (MKL's row-major
    path)."""
    if packed is not None and x.shape[0] >= packed.min_rows:
        return packed_matmul(x, packed.matrix, bias)
    if bias is None:
        return torch.mm(x, weight_t)
    return torch.addmm(bias, x, weight_t)


@cache
def one_row_faster_packed(dtype: torch.dtype) -> bool:
    """Whether this CPU multiplies one row by a oneDNN-packed matrix faster than by the row-major one: timed
    once per process and dtype (about 0.1 s) on a matrix too large for the cache, best of a few rounds,
    and logged (a fact about the machine, like `cpu_packing_available`)."""
    in_features, out_features = _PROBE_SHAPE
    weight_t = torch.full((in_features, out_features), 0.5, dtype=dtype)  # (in, out); values do not matter
    matrix = torch.ops.mkldnn._reorder_linear_weight(weight_t.t(), _PACKED_FOR_ROWS)
    x = torch.full((1, in_features), 0.5, dtype=dtype)
    plain_s, packed_s = float("inf"), float("inf")
    with torch.inference_mode():
        for _ in range(_PROBE_ROUNDS):  # interleaved: a busy moment slows both
            plain_s = min(plain_s, _seconds(lambda: torch.mm(x, weight_t)))
            packed_s = min(packed_s, _seconds(lambda: packed_matmul(x, matrix)))
    logger.info(
        "one-row %s matmul by a %d MiB matrix: row-major %.2f ms, oneDNN-packed %.2f ms: decode steps use %s",
        str(dtype).removeprefix("torch."),
        weight_t.nbytes // 2**20,
        plain_s * 1e3,
        packed_s * 1e3,
        "the packed weights" if packed_s < plain_s else "the row-major weights",
    )
    return packed_s < plain_s


def _seconds(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started
