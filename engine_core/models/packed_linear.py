"""The checkpoint's projections of one input packed into one matrix (`PackedLinear`), and its row-parallel
form (`RowParallelLinear`: each rank its slice of the inputs, the partial outputs summed over the ranks).

Under tensor parallelism a column-parallel `PackedLinear` holds each part's slice of the output columns
(its query heads, its KV heads, its slice of the MLP's intermediate width) and a row-parallel one its slice
of the input rows; `checkpoint_views` says which slice of each checkpoint tensor it holds, so that loading
reads only that slice.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn

from openinfer.engine_core.models.opaque_ops import linear
from openinfer.engine_core.models.tensor_parallel import Shard, TensorParallel
from openinfer.engine_core.models.vocab_matrix import VocabMatrix
from openinfer.engine_core.models.weights import CheckpointSlice, Target
from openinfer.kernels.cpu_matmul import PackedWeight, pack_weight, weight_matmul


class PackedLinear(nn.Module):
    """The checkpoint's projections of one input, packed side by side so that they cost one matmul:
    y = x @ weight_t (+ bias), its columns the outputs of `parts` in order (q, k, v or gate, up).

    weight_t (in_features, out_features) is the transpose of the checkpoint's (out, in) layout: on the CPU
    MKL multiplies the few rows of a decode step by a row-major (in, out) matrix up to 2x faster than by
    the transposed one `F.linear` hands it. `checkpoint_views` maps the checkpoint's names to views of it.
    After loading, `pack_for_cpu` may add a copy in oneDNN's blocked layout (cpu_matmul.py).

    `out_shards` (a part's slice of its checkpoint tensor's output rows) and `in_shard` (the slice of the
    input columns every part holds) describe a tensor-parallel rank's slice; by default each is whole.
    """

    def __init__(
        self,
        in_features: int,
        parts: dict[str, int],
        bias: bool,
        out_shards: Mapping[str, Shard] | None = None,
        in_shard: Shard | None = None,
    ) -> None:
        super().__init__()
        self.parts = dict(parts)  # checkpoint module name -> output width (this rank's), in column order
        self.out_shards = dict(
            out_shards or {}
        )  # part -> its rows of the checkpoint's (out, in); absent: all
        self.in_shard = in_shard  # the checkpoint's input columns this matrix holds; None: all
        out_features = sum(parts.values())
        self.weight_t = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: PackedWeight | None = None  # a oneDNN-packed copy (pack_for_cpu), or None
        # packed, its place in a compiled step's context (compiled_forward.py sets it); None: not compiled
        self.pack_index: int | None = None

    def forward(self, x: Tensor) -> Tensor:
        """(n, in_features) -> (n, out_features)."""
        return linear(x, self.weight_t, self.packed, self.bias, self.pack_index)

    def checkpoint_views(self) -> Iterator[tuple[str, Target]]:
        """(checkpoint name relative to the parent module, target) per part: a view in the checkpoint
        tensor's shape, or, sharded, the view and the slice of the checkpoint tensor it takes."""
        start = 0
        in_features = self.weight_t.shape[0]
        cols = self.in_shard or Shard(0, in_features, in_features)
        for name, width in self.parts.items():
            rows = self.out_shards.get(name) or Shard(0, width, width)
            weight = self.weight_t[:, start : start + width].t()  # (width, in_features)
            yield f"{name}.weight", _target(weight, (rows, cols))
            if self.bias is not None:  # a row-parallel matrix's bias is whole on every rank
                yield f"{name}.bias", _target(self.bias[start : start + width], (rows,))
            start += width

    def pack_for_cpu(self) -> None:
        """From now on multiply by a oneDNN-packed copy of the (loaded) weight: 2+ rows, and one row too
        where this CPU reads the packed layout faster (cpu_matmul.py); the others by weight_t."""
        self.packed = pack_weight(self.weight_t.t())


class RowParallelLinear(PackedLinear):
    """A `PackedLinear` holding this rank's slice `in_shard` of the input columns: its partial products are
    summed over the ranks (one all-reduce), then the (replicated) bias is added once."""

    def __init__(self, in_shard: Shard, parts: dict[str, int], bias: bool, parallel: TensorParallel) -> None:
        super().__init__(in_shard.size, parts, bias, in_shard=in_shard)
        self.parallel = parallel

    def forward(self, x: Tensor) -> Tensor:
        """(n, in_shard.size) -> (n, out_features), the same on every rank."""
        y = self.parallel.all_reduce(weight_matmul(x, self.weight_t, self.packed, None))
        return y if self.bias is None else y + self.bias


def row_parallel_linear(
    in_shard: Shard, parts: dict[str, int], bias: bool, parallel: TensorParallel
) -> PackedLinear:
    """The output projection of a sharded block: a plain `PackedLinear` at one rank, else row-parallel."""
    if parallel.single:
        return PackedLinear(in_shard.total, parts, bias)
    return RowParallelLinear(in_shard, parts, bias, parallel)


class Linear(nn.Linear):
    """``nn.Linear`` (the checkpoint's (out, in) weight as it is) that, after `pack_for_cpu`, multiplies by a
    oneDNN-packed copy of its weight for the row counts this CPU runs faster that way (cpu_matmul.py): a
    drafter's projections, which are not packed side by side."""

    packed: PackedWeight | None = None  # set by pack_for_cpu

    def pack_for_cpu(self) -> None:
        """From now on multiply by a oneDNN-packed copy of the (loaded) weight where it pays."""
        self.packed = pack_weight(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        """(..., in_features) -> (..., out_features)."""
        if self.packed is None:
            return super().forward(x)
        rows = x.reshape(-1, x.shape[-1])  # (n, in_features)
        return weight_matmul(rows, self.weight.t(), self.packed, self.bias).view(*x.shape[:-1], -1)


def pack_modules_for_cpu(model: nn.Module) -> None:
    """Give every projection (`PackedLinear`, `Linear`) and vocabulary matrix in ``model`` a oneDNN-packed
    copy (kernels/cpu_matmul.py; call after loading, only where `cpu_packing_available`). The plain matrices
    stay, for the rows the packed copy does not serve and for embedding lookups: twice the weights' memory."""
    for module in model.modules():
        if isinstance(module, PackedLinear | Linear | VocabMatrix):
            module.pack_for_cpu()


def _target(view: Tensor, shards: tuple[Shard, ...]) -> Target:
    """``view`` itself when it takes the whole checkpoint tensor, else the slice of it that it takes."""
    if all(shard.whole for shard in shards):
        return view
    full_shape = tuple(shard.total for shard in shards)
    return CheckpointSlice(view, full_shape, tuple(shard.slice for shard in shards))
