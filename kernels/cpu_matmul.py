"""Matmuls by a fixed weight on the CPU through oneDNN, with the weight packed once into oneDNN's blocked
layout (as vLLM's CPU build does for every dense projection and the LM head).

Why: on a decode step's few rows MKL's sgemm by a plain (in, out) matrix runs far below the memory bandwidth
once there is more than one row, and a prefill chunk's GEMM far below the core's FLOPs. Measured on one AVX-512
core (float32, `benchmarks/cpu_matmul.py`): the 151,936 x 1024 LM head at 8 rows 47-53 ms packed against
93-139 ms plain; a 6,144 x 1024 projection at 512 rows 61 ms against 97 ms. At one row the plain row-major
matrix is as fast or faster (a layer's projections 3.2 ms against 4.1 packed), so `weight_matmul` keeps it.
"""

from __future__ import annotations

import torch
from torch import Tensor

# oneDNN blocks the packed weight for this many rows (vLLM's choice too); any row count runs on it.
_PACKED_FOR_ROWS = 32


def cpu_packing_available(dtype: torch.dtype) -> bool:
    """Whether this torch build and CPU run oneDNN matmuls in `dtype` (float32 always with oneDNN; bfloat16
    where oneDNN reports bf16 support: native with avx512_bf16 or AMX, emulated on plain AVX-512, where
    every bfloat16 matmul is slow, packed or not: docs/benchmarks.md)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack_weight(weight: Tensor) -> Tensor:
    """(out_features, in_features) CPU weight -> the same matrix in oneDNN's blocked layout (an opaque
    tensor only `packed_matmul` reads). A strided view (a transposed parameter) is read as it is."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACKED_FOR_ROWS)


def packed_matmul(x: Tensor, packed: Tensor, bias: Tensor | None = None) -> Tensor:
    """(n, in_features) @ packed.T (+ bias) -> (n, out_features), x's dtype, a plain contiguous tensor."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


def weight_matmul(x: Tensor, weight_t: Tensor, packed: Tensor | None, bias: Tensor | None = None) -> Tensor:
    """(n, in_features) @ weight_t (in_features, out_features) (+ bias): by the oneDNN-packed copy of the
    same weight when there is one and n > 1, else by weight_t itself (MKL's row-major path)."""
    if packed is not None and x.shape[0] > 1:
        return packed_matmul(x, packed, bias)
    if bias is None:
        return torch.mm(x, weight_t)
    return torch.addmm(bias, x, weight_t)
