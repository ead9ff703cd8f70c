"""Qwen3.5's Gated DeltaNet layer (linear attention with a recurrent state), numerically mirroring
transformers' `Qwen3_5GatedDeltaNet`, over state slots instead of a per-sequence cache.

Per token: one packed projection gives the mixed q/k/v (``in_proj_qkv``), the output gate z (``in_proj_z``), b
and a (``in_proj_b``/``in_proj_a``, one value per value head); q/k/v pass a depthwise causal conv1d (SiLU); then
the gated delta rule with beta = sigmoid(b) and log-decay g = -exp(A_log) * softplus(a + dt_bias), q and k
L2-normalised; the output is RMS-normalised per value head and gated by SiLU(z), then projected back.

A request's conv state (the last kernel - 1 mixed q/k/v rows) and recurrent state ((value heads, key dim,
value dim), float32) live in slots of this layer's state tensors (`allocate_states`); which slot each request
reads and which each token writes is the step's `StateIndex` (kernels/state_index.py). The conv and the delta
rule run the engine's kernels (`KernelBackends.causal_conv` and `.gated_delta`: torch on the CPU, Triton and
fla on CUDA), short or long form by the step's shape.

Tensor-parallel (a `TensorParallel` of several ranks), each rank holds whole key heads and the value heads
they serve (key head h serves value heads h * r ... h * r + r - 1, r = value heads / key heads): its q, k and v
rows of in_proj_qkv (three slices of the checkpoint tensor) and the same conv channels, its value heads' rows
of in_proj_z/b/a and entries of A_log and dt_bias, and its value heads' columns of out_proj (row-parallel:
one all-reduce). The per-head norm is replicated; the conv and recurrent states hold the rank's channels and
heads only. A rank count that does not divide the key heads is refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from openinfer.engine_core.models.hybrid_config import HybridConfig
from openinfer.engine_core.models.packed_linear import PackedLinear, row_parallel_linear
from openinfer.engine_core.models.qwen3 import rms_normalize
from openinfer.engine_core.models.tensor_parallel import Shard, TensorParallel
from openinfer.engine_core.models.weights import CheckpointSlice, Target
from openinfer.kernels.kernel_backends import KernelBackends
from openinfer.kernels.state_index import StateIndex


class GatedRMSNorm(nn.Module):
    """weight * (x / rms(x)) * silu(gate) over the last dim (transformers' `Qwen3_5RMSNormGated`: normalised
    in float32, scaled in the input's dtype, gated in float32)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        scaled = self.weight * rms_normalize(x.float(), self.eps).to(x.dtype)
        return (scaled * F.silu(gate.float())).to(x.dtype)


class DepthwiseConv(nn.Module):
    """The checkpoint's `conv1d.weight` (channels, 1, kernel): a depthwise causal convolution, no bias."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))


class GatedDeltaNet(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        hybrid: HybridConfig,
        eps: float,
        kernels: KernelBackends,
        parallel: TensorParallel = TensorParallel.SINGLE,
    ) -> None:
        super().__init__()
        self.causal_conv, self.gated_delta = kernels.causal_conv, kernels.gated_delta
        self.head_k_dim, self.head_v_dim = hybrid.linear_key_head_dim, hybrid.linear_value_head_dim
        # this rank's key heads and the value heads they serve (all of them at one rank)
        self.k_heads, self.v_heads = linear_heads(hybrid, parallel)
        self.num_k_heads, self.num_v_heads = self.k_heads.size, self.v_heads.size
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim  # the rank's q, k and v channels
        self.conv_kernel = hybrid.linear_conv_kernel_dim
        self.full_key_dim, self.full_conv_dim = hybrid.key_dim, hybrid.conv_dim  # the checkpoint's widths
        values = self.v_heads.scaled(self.head_v_dim)  # checkpoint rows of in_proj_z, columns of out_proj
        self.in_proj = PackedLinear(
            hidden_size,
            {
                "in_proj_qkv": self.conv_dim,
                "in_proj_z": self.value_dim,
                "in_proj_b": self.num_v_heads,
                "in_proj_a": self.num_v_heads,
            },
            False,
            # in_proj_qkv's three row slices are `sharded_targets`'
            out_shards={"in_proj_z": values, "in_proj_b": self.v_heads, "in_proj_a": self.v_heads},
        )
        self.conv1d = DepthwiseConv(self.conv_dim, self.conv_kernel)
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, eps)
        self.out_proj = row_parallel_linear(values, {"out_proj": hidden_size}, False, parallel)
        # Set by `allocate_states`: (num_slots, conv_dim, kernel - 1) in the weights' dtype and
        # (num_slots, value heads, key dim, value dim) float32.
        self.conv_state: Tensor | None = None
        self.recurrent_state: Tensor | None = None

    def sharded_targets(self) -> dict[str, Target]:
        """A rank's slices of the checkpoint tensors that are not one `PackedLinear` part's rows, by name
        relative to this layer: in_proj_qkv's and conv1d's q, k and v rows, A_log's and dt_bias's value
        heads. Empty at one rank (the parameters take the tensors whole)."""
        if self.k_heads.whole:
            return {}
        keys, values = self.k_heads.scaled(self.head_k_dim), self.v_heads.scaled(self.head_v_dim)
        rows = (  # the checkpoint's rows of q, k and v, in the rank's channel order
            keys.slice,
            slice(self.full_key_dim + keys.start, self.full_key_dim + keys.start + keys.size),
            slice(2 * self.full_key_dim + values.start, 2 * self.full_key_dim + values.start + values.size),
        )
        qkv = self.in_proj.weight_t[:, : self.conv_dim].t()  # (conv_dim, hidden): the rank's q, k, v rows
        ends = (self.key_dim, 2 * self.key_dim, self.conv_dim)

        def three_slices(local: Tensor) -> tuple[CheckpointSlice, ...]:
            full_shape = (self.full_conv_dim, *local.shape[1:])
            starts = (0, *ends[:2])
            return tuple(
                CheckpointSlice(local[start:end], full_shape, (rows_,))
                for start, end, rows_ in zip(starts, ends, rows, strict=True)
            )

        heads = (self.v_heads.total,)
        return {
            "in_proj_qkv.weight": three_slices(qkv),
            "conv1d.weight": three_slices(self.conv1d.weight),
            "A_log": CheckpointSlice(self.A_log, heads, (self.v_heads.slice,)),
            "dt_bias": CheckpointSlice(self.dt_bias, heads, (self.v_heads.slice,)),
        }

    def allocate_states(self, num_slots: int, device: torch.device) -> None:
        """Zeroed state slots for `num_slots` states (each request's slots come from the KV manager)."""
        dtype = self.dt_bias.dtype
        self.conv_state = torch.zeros(
            num_slots, self.conv_dim, self.conv_kernel - 1, dtype=dtype, device=device
        )
        self.recurrent_state = torch.zeros(
            num_slots, self.num_v_heads, self.head_k_dim, self.head_v_dim, dtype=torch.float32, device=device
        )

    @property
    def state_bytes(self) -> int:
        """Bytes of one slot's conv and recurrent state at the weights' dtype."""
        conv = self.conv_dim * (self.conv_kernel - 1) * self.dt_bias.element_size()
        return conv + self.num_v_heads * self.head_k_dim * self.head_v_dim * 4

    def forward(self, x: Tensor, states: StateIndex) -> Tensor:
        """(n, hidden) -> (n, hidden); reads and writes the state slots `states` names."""
        if self.conv_state is None or self.recurrent_state is None:
            raise RuntimeError("GatedDeltaNet has no state slots: call allocate_states first")
        n = x.shape[0]
        mixed, z, b, a = self.in_proj(x).split(
            [self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads], dim=-1
        )
        conv = self.causal_conv.for_step(states)
        mixed = conv(mixed, self.conv1d.weight[:, 0], self.conv_state, states)  # (n, conv_dim)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        beta = b.sigmoid()  # (n, v heads)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # (n, v heads) float32
        out = self.gated_delta.for_step(states)(
            q.reshape(n, self.num_k_heads, self.head_k_dim),
            k.reshape(n, self.num_k_heads, self.head_k_dim),
            v.reshape(n, self.num_v_heads, self.head_v_dim),
            g,
            beta,
            self.recurrent_state,
            states,
        )  # (n, v heads, v dim)
        out = self.norm(out, z.reshape(n, self.num_v_heads, self.head_v_dim))
        return self.out_proj(out.reshape(n, self.value_dim))


def linear_heads(hybrid: HybridConfig, parallel: TensorParallel) -> tuple[Shard, Shard]:
    """A rank's key heads and the value heads they serve, both split evenly; ValueError naming the numbers
    when the ranks do not divide the key heads (a key head and its value heads stay on one rank)."""
    num_k, num_v = hybrid.linear_num_key_heads, hybrid.linear_num_value_heads
    if num_k % parallel.world_size:
        raise ValueError(
            f"--tensor-parallel-size {parallel.world_size} does not divide the model's {num_k} Gated DeltaNet "
            f"key heads (linear_num_key_heads; {num_v} value heads, {num_v // num_k} to a key head): each rank "
            "holds whole key heads with their value heads; choose a size that divides both"
        )
    return parallel.shard_range(num_k, "Gated DeltaNet key heads"), parallel.shard_range(
        num_v, "Gated DeltaNet value heads"
    )
