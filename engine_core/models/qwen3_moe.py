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
from openinfer.engine_core.models.qwen3 import Qwen3ForCausalLM
from openinfer.engine_core.models.weights import Target, checkpoint_names, load_checkpoint
from openinfer.kernels.kernel_backends import ExpertsBackend, KernelBackends


class Qwen3MoeExperts(nn.Module):
    """Every expert's weights stacked, in transformers 5's fused layout and under its names:
    gate_up_proj (E, 2 * I, H), gate rows then up rows; down_proj (E, H, I)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def per_expert_views(self) -> Iterator[tuple[str, Tensor]]:
        """(name relative to this module, view) of each expert's projections as released checkpoints name
        them: `E.gate_proj.weight` (I, H), `E.up_proj.weight` (I, H), `E.down_proj.weight` (H, I)."""
        for expert, (gate_up, down) in enumerate(zip(self.gate_up_proj, self.down_proj, strict=True)):
            gate, up = gate_up.chunk(2, dim=0)  # (I, H) each
            yield f"{expert}.gate_proj.weight", gate
            yield f"{expert}.up_proj.weight", up
            yield f"{expert}.down_proj.weight", down


class Qwen3MoeSparseBlock(nn.Module):
    """Router (`gate`, a bias-free (E, H) linear) and experts, run by the `experts` kernel; (n, H) -> (n, H) in
    the input's dtype."""

    def __init__(self, hidden_size: int, moe: MoeConfig, experts: ExpertsBackend) -> None:
        super().__init__()
        self.experts_kernel = experts
        self.top_k = moe.num_experts_per_tok
        self.norm_topk_prob = moe.norm_topk_prob
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)
        self.experts = Qwen3MoeExperts(moe.num_experts, hidden_size, moe.moe_intermediate_size)

    def forward(self, x: Tensor) -> Tensor:
        probs = self.gate(x).softmax(dim=-1, dtype=torch.float32)  # (n, E)
        topk_weights, topk_ids = probs.topk(self.top_k, dim=-1)  # (n, k) float32, int64
        if self.norm_topk_prob:
            topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
        return self.experts_kernel.run(
            x, self.experts.gate_up_proj, self.experts.down_proj, topk_weights, topk_ids
        )


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3-MoE causal LM over a paged KV cache: `Qwen3ForCausalLM` (same forward, `forward_with_aux`,
    logits and KV cache layout) whose sparse layers' MLP is a `Qwen3MoeSparseBlock`.

    `load_weights` reads either form of the experts' weights: per expert as released
    (`mlp.experts.E.gate_proj.weight`, ...) or stacked as transformers 5 holds them (`mlp.experts.gate_up_proj`).
    """

    def __init__(self, config: ModelConfig, kernels: KernelBackends) -> None:
        moe = config.moe
        if moe is None:
            raise ValueError("Qwen3MoeForCausalLM needs a qwen3_moe config (its experts); this one is dense")
        super().__init__(
            config,
            kernels,
            lambda layer: (
                Qwen3MoeSparseBlock(config.hidden_size, moe, kernels.moe) if moe.is_sparse(layer) else None
            ),
        )

    def load_weights(self, folder: Path) -> None:
        """As `Qwen3ForCausalLM.load_weights`, the experts in whichever form the checkpoint holds them."""
        folder = Path(folder)
        load_checkpoint(
            folder,
            self.checkpoint_tensors(stacked_experts=holds_stacked_experts(checkpoint_names(folder))),
            unexpected_hint=" (is this a Qwen3-MoE checkpoint of this config.json?)",
            skip=lambda name: name == "lm_head.weight" and self.lm_head is None,
        )

    def checkpoint_tensors(self, stacked_experts: bool = True) -> dict[str, Target]:
        """Every tensor of a Hugging Face checkpoint of this model by its name there, the experts stacked
        (transformers 5's names) or, with `stacked_experts=False`, per expert (the released names)."""
        targets = super().checkpoint_tensors()
        return targets if stacked_experts else per_expert_targets(self, targets)


def holds_stacked_experts(names: list[str]) -> bool:
    """Whether a checkpoint's tensor names hold the experts stacked (transformers 5), not per expert."""
    return any(name.endswith(".mlp.experts.gate_up_proj") for name in names)


def per_expert_targets(model: nn.Module, targets: dict[str, Target]) -> dict[str, Target]:
    """``targets`` (a model's checkpoint tensors, experts stacked) with every `Qwen3MoeExperts`' stacked
    tensors replaced by views of each expert's projections under the released names."""
    for path, module in model.named_modules():
        if isinstance(module, Qwen3MoeExperts):
            del targets[f"{path}.gate_up_proj"], targets[f"{path}.down_proj"]
            targets.update((f"{path}.{name}", view) for name, view in module.per_expert_views())
    return targets
