"""The model's decoder stack compiled by torch.compile (inductor), for ``-O1``..``-O3``.

One compiled function per model: the token count is dynamic (marked on every call, so a step of any size
from 2 up reuses one graph; a one-token step, which dynamo specialises, gets a graph of its own), the aux
layers a drafter reads are part of its key: at most four graphs with a drafter. Dynamo keeps the graphs of
every instance under the one code object of ``_stack`` (8 at most): an engine process compiles one model.
Each of ``compile_sizes`` (vLLM's key: token counts) gets a graph specialised to it, compiled with static
shapes under ``_sized_stack``'s code object, its limit raised to hold them all.
Paged attention, a Gated DeltaNet layer and the MoE experts are opaque
custom ops (models/opaque_ops.py), so the stack is one graph with no break. On the CPU, inductor freezes the
weights (constants: oneDNN gets them prepacked) and fuses the norms, RoPE, SiLU·mul and residual adds.

Compiled artifacts are cached on disk (inductor's FX-graph cache and AOTAutograd's, keyed by the graph, the
inductor config and torch's version, so a changed model, dtype or flag compiles again) under the config's
``cache_dir``. Each graph compiled is logged with its time and whether the cache served it. A host without a
C++ compiler (inductor's CPU code needs one) runs eagerly, after one warning (:func:`compiler_missing`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._dynamo
from torch import Tensor

from openinfer.engine_core.compilation_config import CompilationConfig
from openinfer.engine_core.models.opaque_ops import Mixer, StepContext, step_context
from openinfer.engine_core.models.packed_linear import PackedLinear
from openinfer.engine_core.models.qwen3 import Qwen3ForCausalLM
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.kernel_backends import KernelBackends

logger = logging.getLogger(__name__)

_MAX_TOKENS = 1 << 24  # the dynamic token count's bound (a step's tokens are far fewer)


def compiler_missing(device: torch.device) -> str | None:
    """Why this host cannot compile for ``device`` (inductor's CPU code is C++: it needs ``$CXX`` or g++), or
    None."""
    if device.type != "cpu":
        return None
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) for inductor's CPU code: install g++ (Debian: apt install g++)"
    return None


class CompiledForward:
    """``model.model(input_ids, positions, kv_caches, attn, aux_layer_ids)``, compiled."""

    def __init__(
        self,
        model: Qwen3ForCausalLM,
        kernels: KernelBackends,
        config: CompilationConfig,
        mixers: Sequence[Mixer] = (),
    ) -> None:
        self.model = model
        self.kernels = kernels
        self.mixers = tuple(mixers)  # a hybrid model's Gated DeltaNet layers, in layer order
        # the projections keep openinfer's oneDNN-packed weights, each an opaque op reading its copy here
        projections = [m for m in model.modules() if isinstance(m, PackedLinear) and m.packed is not None]
        for index, module in enumerate(projections):
            module.pack_index = index
        self.packed = tuple(module.packed for module in projections if module.packed is not None)
        # the RoPE table is built on first use: built before tracing, every graph reads the one table
        weight = next(model.parameters())
        model.model.rotary.cos_sin(torch.zeros(1, dtype=torch.int64, device=weight.device), weight.dtype)
        self.cache_dir = config.artifact_dir()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # inductor and AOTAutograd keep their caches here (read when a graph compiles, not at import)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.cache_dir)
        # freezing: the weights are constants, folded into the graph (the packed ones stay opaque)
        options: dict[str, str | int | bool | Callable[..., Any]] = {"freezing": True, "fx_graph_cache": True}
        self._compiled = torch.compile(self._stack, backend="inductor", fullgraph=True, options=options)
        self.compile_sizes = frozenset(config.compile_sizes or ())  # token counts with their own graph
        self._sized = torch.compile(
            self._sized_stack, backend="inductor", fullgraph=True, dynamic=False, options=options
        )
        # a graph per size and aux layers (none, a drafter's) under _sized_stack's one code object
        self._sized_limit = max(torch._dynamo.config.recompile_limit, 2 * len(self.compile_sizes))
        self._num_graphs = 0
        logger.info(
            "model step compiled with torch.compile (inductor); artifacts cached in %s", self.cache_dir
        )

    def _stack(
        self, input_ids: Tensor, positions: Tensor, kv_caches: list[Tensor], aux_layer_ids: tuple[int, ...]
    ) -> tuple[Tensor, list[Tensor]]:
        return self.model.model(input_ids, positions, kv_caches, None, aux_layer_ids)

    def _sized_stack(
        self, input_ids: Tensor, positions: Tensor, kv_caches: list[Tensor], aux_layer_ids: tuple[int, ...]
    ) -> tuple[Tensor, list[Tensor]]:
        return self.model.model(input_ids, positions, kv_caches, None, aux_layer_ids)

    def __call__(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv_caches: list[Tensor],
        attn: AttentionMetadata,
        aux_layer_ids: Sequence[int] = (),
    ) -> tuple[Tensor, list[Tensor]]:
        """The final hidden states (num_tokens, hidden) and the aux layers' outputs, as the eager stack."""
        if input_ids.shape[0] in self.compile_sizes:
            with torch._dynamo.config.patch(recompile_limit=self._sized_limit):
                return self._run(self._sized, input_ids, positions, kv_caches, attn, aux_layer_ids)
        if input_ids.shape[0] > 1:  # one graph for every count from 2 up; a one-token step has its own
            torch._dynamo.mark_dynamic(input_ids, 0, min=2, max=_MAX_TOKENS)
            torch._dynamo.mark_dynamic(positions, 0, min=2, max=_MAX_TOKENS)
        return self._run(self._compiled, input_ids, positions, kv_caches, attn, aux_layer_ids)

    def _run(
        self,
        compiled: Callable[..., tuple[Tensor, list[Tensor]]],
        input_ids: Tensor,
        positions: Tensor,
        kv_caches: list[Tensor],
        attn: AttentionMetadata,
        aux_layer_ids: Sequence[int],
    ) -> tuple[Tensor, list[Tensor]]:
        """``compiled`` over the step with the opaque ops' context set; a graph it compiles is logged."""
        context = StepContext(
            attn, kv_caches, self.kernels.attention, self.kernels.moe, self.mixers, self.packed
        )
        counters = torch._dynamo.utils.counters
        hits, misses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
        started = time.perf_counter()
        with step_context(context):
            out = compiled(input_ids, positions, kv_caches, tuple(aux_layer_ids))
        graphs = counters["stats"]["unique_graphs"]
        if graphs > self._num_graphs:  # this call compiled (or loaded) a graph
            self._num_graphs = graphs
            logger.info(
                "compiled the model step for %s%d tokens%s in %.1f s (inductor cache: %d hit, %d missed)",
                "exactly " if compiled is self._sized else "",
                input_ids.shape[0],
                f" with aux layers {list(aux_layer_ids)}" if aux_layer_ids else "",
                time.perf_counter() - started,
                counters["inductor"]["fxgraph_cache_hit"] - hits,
                counters["inductor"]["fxgraph_cache_miss"] - misses,
            )
        return out
