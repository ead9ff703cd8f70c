"""Qwen3-MoE decoder: Qwen3's attention, norms and RoPE (qwen3.py) with a sparse mixture-of-experts block on
the layers transformers' `Qwen3MoeForCausalLM` makes sparse, and a dense SwiGLU MLP on the others.

Each sparse block routes every token to its top-k experts (softmax in float32 over the router's logits,
renormalised when `norm_topk_prob`) and computes the experts through the engine's MoE kernel (kernels/moe.py's
grouped matmuls on the CPU, Triton's fused-MoE on CUDA: kernels/kernel_backends.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from openinfer.engine_core.models.config import ModelConfig, MoeConfig
from openinfer.engine_core.models.opaque_ops import experts
from openinfer.engine_core.models.qwen3 import SINGLE, Qwen3ForCausalLM
from openinfer.engine_core.models.tensor_parallel import Shard, TensorParallel
from openinfer.engine_core.models.weights import CheckpointSlice, Target, checkpoint_names, load_checkpoint
from openinfer.kernels.kernel_backends import ExpertsBackend, KernelBackends


class Qwen3MoeExperts(nn.Module):
    """This rank's experts' weights stacked, in transformers 5's fused layout and under its names:
    gate_up_proj (E_r, 2 * I_r, H), gate rows then up rows; down_proj (E_r, H, I_r). At one rank E_r = E,
    I_r = I; tensor-parallel, each rank holds every expert's slice `width` of I; under expert parallelism,
    the whole experts `experts` (E / N of them) (`TensorParallel.experts`, `expert_width`)."""

    def __init__(self, moe: MoeConfig, hidden_size: int, parallel: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.experts = parallel.experts(moe.num_experts)  # which experts (global ids) this rank holds
        self.width = parallel.expert_width(moe.moe_intermediate_size)  # its slice of each one's I
        num, width = self.experts.size, self.width.size
        self.gate_up_proj = nn.Parameter(torch.empty(num, 2 * width, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num, hidden_size, width))

    def stacked_targets(self) -> Iterator[tuple[str, Target]]:
        """(name relative to this module, target) of the stacked checkpoint tensors: this rank's experts
        (dim 0) and, split by width, its gate rows and up rows of gate_up_proj (two slices of it) and its
        columns of down_proj."""
        full, hidden = self.width.total, self.gate_up_proj.shape[2]
        gate_up_shape = (self.experts.total, 2 * full, hidden)
        if self.width.whole:
            yield "gate_up_proj", _slice(self.gate_up_proj, gate_up_shape, (self.experts,))
        else:
            gate, up = self.gate_up_proj.chunk(2, dim=1)  # (E_r, I_r, H) each
            up_rows = Shard(full + self.width.start, self.width.size, 2 * full)
            gate_rows = Shard(self.width.start, self.width.size, 2 * full)
            yield (
                "gate_up_proj",
                (
                    CheckpointSlice(gate, gate_up_shape, (self.experts.slice, gate_rows.slice)),
                    CheckpointSlice(up, gate_up_shape, (self.experts.slice, up_rows.slice)),
                ),
            )
        every_row = Shard(0, hidden, hidden)
        down_shape = (self.experts.total, hidden, full)
        yield "down_proj", _slice(self.down_proj, down_shape, (self.experts, every_row, self.width))

    def per_expert_views(self) -> Iterator[tuple[str, Target]]:
        """(name relative to this module, target) of each of this rank's experts' projections as released
        checkpoints name them: `E.gate_proj.weight` (I, H), `E.up_proj.weight` (I, H), `E.down_proj.weight`
        (H, I), E the expert's global id; split by width, this rank's rows (columns of down_proj)."""
        full, hidden = self.width.total, self.gate_up_proj.shape[2]
        every_row = Shard(0, hidden, hidden)
        for local, (gate_up, down) in enumerate(zip(self.gate_up_proj, self.down_proj, strict=True)):
            expert = self.experts.start + local
            gate, up = gate_up.chunk(2, dim=0)  # (I_r, H) each
            yield f"{expert}.gate_proj.weight", _slice(gate, (full, hidden), (self.width,))
            yield f"{expert}.up_proj.weight", _slice(up, (full, hidden), (self.width,))
            yield f"{expert}.down_proj.weight", _slice(down, (hidden, full), (every_row, self.width))

    def other_experts(self) -> Iterator[str]:
        """The released names (relative to this module) of the experts other ranks hold: not read here."""
        for expert in range(self.experts.total):
            if not self.experts.start <= expert < self.experts.start + self.experts.size:
                yield from (f"{expert}.{proj}.weight" for proj in ("gate_proj", "up_proj", "down_proj"))


class Qwen3MoeSparseBlock(nn.Module):
    """Router (`gate`, a bias-free (E, H) linear, replicated on every rank) and this rank's experts, run by
    the `experts` kernel; (n, H) -> (n, H) in the input's dtype, the same on every rank.

    Tensor-parallel, every rank routes every token (its input is replicated) and sums the contributions of
    what it holds: every expert's slice of the width, or (expert parallelism) its whole experts, the pairs
    routed to other ranks' experts contributing nothing; one all-reduce adds the ranks' partial sums (under
    expert parallelism it is the tokens' exchange: the simplest correct form on gloo, one collective)."""

    def __init__(
        self, hidden_size: int, moe: MoeConfig, experts: ExpertsBackend, parallel: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        self.experts_kernel = experts
        self.parallel = parallel
        self.top_k = moe.num_experts_per_tok
        self.norm_topk_prob = moe.norm_topk_prob
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)
        self.experts = Qwen3MoeExperts(moe, hidden_size, parallel)

    def forward(self, x: Tensor) -> Tensor:
        return self.parallel.all_reduce(self.partial(x))

    def partial(self, x: Tensor) -> Tensor:
        """(n, H) -> (n, H): this rank's share of the experts' sum, before the all-reduce (its input
        replicated, as every rank's router is: each rank picks the same experts)."""
        probs = self.gate(x).softmax(dim=-1, dtype=torch.float32)  # (n, E)
        topk_weights, topk_ids = probs.topk(self.top_k, dim=-1)  # (n, k) float32, int64
        if self.norm_topk_prob:
            topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
        held = self.experts.experts
        if not held.whole:
            topk_weights, topk_ids = local_routing(topk_weights, topk_ids, held, self.experts_kernel)
        return experts(
            self.experts_kernel, x, self.experts.gate_up_proj, self.experts.down_proj, topk_weights, topk_ids
        )


def local_routing(
    topk_weights: Tensor, topk_ids: Tensor, held: Shard, kernel: ExpertsBackend
) -> tuple[Tensor, Tensor]:
    """The routing in a rank's own expert numbering (0 .. held.size - 1): a pair routed to another rank's
    expert gets id held.size, which a kernel that `skips_absent` skips, else (weight 0) expert 0, computed
    and multiplied by zero; (n, k) float32 and int64."""
    local = topk_ids - held.start  # (n, k)
    here = (local >= 0) & (local < held.size)
    absent = held.size if kernel.skips_absent else 0
    return topk_weights.where(here, 0.0), local.where(here, absent)


def _slice(view: Tensor, full_shape: tuple[int, ...], shards: tuple[Shard, ...]) -> Target:
    """``view`` itself when it takes the whole checkpoint tensor, else the slice of it that it takes."""
    if all(shard.whole for shard in shards):
        return view
    return CheckpointSlice(view, full_shape, tuple(shard.slice for shard in shards))


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3-MoE causal LM over a paged KV cache: `Qwen3ForCausalLM` (same forward, `forward_with_aux`,
    logits and KV cache layout) whose sparse layers' MLP is a `Qwen3MoeSparseBlock`.

    `load_weights` reads either form of the experts' weights: per expert as released
    (`mlp.experts.E.gate_proj.weight`, ...) or stacked as transformers 5 holds them (`mlp.experts.gate_up_proj`);
    tensor-parallel, only this rank's experts or slices of them.
    """

    def __init__(
        self, config: ModelConfig, kernels: KernelBackends, parallel: TensorParallel = SINGLE
    ) -> None:
        moe = config.moe
        if moe is None:
            raise ValueError("Qwen3MoeForCausalLM needs a qwen3_moe config (its experts); this one is dense")
        super().__init__(
            config,
            kernels,
            lambda layer: (
                Qwen3MoeSparseBlock(config.hidden_size, moe, kernels.moe, parallel)
                if moe.is_sparse(layer)
                else None
            ),
            parallel=parallel,
        )

    def load_weights(self, folder: Path) -> None:
        """As `Qwen3ForCausalLM.load_weights`, the experts in whichever form the checkpoint holds them (under
        expert parallelism the other ranks' experts are not read)."""
        folder = Path(folder)
        others = set(other_experts(self))
        load_checkpoint(
            folder,
            self.checkpoint_tensors(stacked_experts=holds_stacked_experts(checkpoint_names(folder))),
            unexpected_hint=" (is this a Qwen3-MoE checkpoint of this config.json?)",
            skip=lambda name: (name == "lm_head.weight" and self.lm_head is None) or name in others,
        )

    def checkpoint_tensors(self, stacked_experts: bool = True) -> dict[str, Target]:
        """Every tensor of a Hugging Face checkpoint of this model by its name there, the experts stacked
        (transformers 5's names) or, with `stacked_experts=False`, per expert (the released names; under
        expert parallelism this rank's experts only)."""
        targets = super().checkpoint_tensors()
        for path, module in self.named_modules():
            if isinstance(module, Qwen3MoeExperts):
                del targets[f"{path}.gate_up_proj"], targets[f"{path}.down_proj"]
                views = module.stacked_targets() if stacked_experts else module.per_expert_views()
                targets.update((f"{path}.{name}", view) for name, view in views)
        return targets


def holds_stacked_experts(names: list[str]) -> bool:
    """Whether a checkpoint's tensor names hold the experts stacked (transformers 5), not per expert."""
    return any(name.endswith(".mlp.experts.gate_up_proj") for name in names)


def other_experts(model: nn.Module) -> Iterator[str]:
    """The released names of the experts that other ranks hold (expert parallelism), in every layer."""
    for path, module in model.named_modules():
        if isinstance(module, Qwen3MoeExperts):
            yield from (f"{path}.{name}" for name in module.other_experts())


def per_expert_targets(model: nn.Module, targets: dict[str, Target]) -> dict[str, Target]:
    """``targets`` (a model's checkpoint tensors, experts stacked) with every `Qwen3MoeExperts`' stacked
    tensors replaced by views of each expert's projections under the released names."""
    for path, module in model.named_modules():
        if isinstance(module, Qwen3MoeExperts):
            del targets[f"{path}.gate_up_proj"], targets[f"{path}.down_proj"]
            targets.update((f"{path}.{name}", view) for name, view in module.per_expert_views())
    return targets
