"""The CPU's weight matmul: the oneDNN-packed copy is used from the row count the one-row probe chose, and
every path computes x @ W.T."""

from __future__ import annotations

import pytest
import torch

from openinfer.kernels.cpu_matmul import (
    PackedWeight,
    one_row_faster_packed,
    pack_weight,
    packed_matmul,
    weight_matmul,
)

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")


def test_pack_weight_carries_the_probed_choice() -> None:
    """A packed weight serves one row exactly when the probe found the packed layout faster on this CPU."""
    weight = torch.randn(96, 64)
    assert pack_weight(weight).min_rows == (1 if one_row_faster_packed(torch.float32) else 2)


@pytest.mark.parametrize("min_rows", [1, 2])
@pytest.mark.parametrize("rows", [1, 2, 40])  # one decode row, two, past the 32 rows oneDNN packs for
def test_weight_matmul_takes_the_path_min_rows_names(min_rows: int, rows: int) -> None:
    """Below min_rows the row-major matrix multiplies (bit for bit torch.mm), from it the packed copy
    (bit for bit oneDNN's); both equal x @ W.T within float tolerance, with and without a bias."""
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=generator)  # (out, in)
    bias = torch.randn(96, generator=generator)
    weight_t = weight.t().contiguous()
    packed = PackedWeight(pack_weight(weight).matrix, min_rows)
    x = torch.randn(rows, 64, generator=generator)
    for b in (None, bias):
        got = weight_matmul(x, weight_t, packed, b)
        if rows >= min_rows:
            assert torch.equal(got, packed_matmul(x, packed.matrix, b))
        else:
            assert torch.equal(got, torch.mm(x, weight_t) if b is None else torch.addmm(b, x, weight_t))
        torch.testing.assert_close(got, x @ weight.t() + (0 if b is None else b))
