"""The model's ops that a compiled forward keeps opaque: paged attention, a Gated DeltaNet layer's mixing, the
MoE experts and the projections by oneDNN-packed weights (kernels/cpu_matmul.py: inductor's own GEMMs were
slower on the CPU than these, docs/benchmarks.md), each a ``torch.library`` custom op, so that torch.compile
traces the decoder stack as one graph (token count dynamic) without breaking at every layer.

These ops read what varies per step and cannot be a graph input (the attention metadata's host lists, the KV
caches, the state slots) from a :class:`StepContext`, set around the compiled call by :func:`step_context`
(which refuses nesting). Eager steps never use them: the layers call their kernels directly, with the
metadata passed (:func:`attention`, :func:`experts` and :func:`deltanet` choose by
``torch.compiler.is_compiling()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from openinfer.kernels.attention_backend import AttentionBackend
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.cpu_matmul import PackedWeight, weight_matmul
from openinfer.kernels.kernel_backends import ExpertsBackend
from openinfer.kernels.state_index import StateIndex

Mixer = Callable[[Tensor, StateIndex], Tensor]  # a Gated DeltaNet layer: (n, hidden) -> (n, hidden)


@dataclass(frozen=True)
class StepContext:
    """What the opaque ops of one compiled step read."""

    attn: AttentionMetadata
    kv_caches: Sequence[Tensor]  # the attention layers' caches, in layer order
    attention_backend: AttentionBackend
    experts_backend: ExpertsBackend
    mixers: Sequence[Mixer] = ()  # a hybrid model's Gated DeltaNet layers, in layer order
    packed: Sequence[PackedWeight] = ()  # the projections' oneDNN-packed weights, by their pack_index


_running: list[StepContext] = []  # the step a compiled forward runs now: at most one (step_context)


@contextmanager
def step_context(context: StepContext) -> Iterator[None]:
    """Make ``context`` the one the opaque ops read while a compiled forward runs; nesting is refused."""
    if _running:
        raise RuntimeError("a compiled step is already running: step contexts do not nest")
    _running.append(context)
    try:
        yield
    finally:
        _running.pop()


def _context() -> StepContext:
    if not _running:
        raise RuntimeError("an opaque op ran outside a compiled step (no step_context)")
    return _running[0]


@torch.library.custom_op("openinfer::paged_attention", mutates_args=())
def paged_attention(q: Tensor, k: Tensor, v: Tensor, cache_index: int, scale: float) -> Tensor:
    """The step's attention backend on cache ``cache_index``: writes k/v there, returns (n, heads, head_dim)."""
    context = _context()
    return context.attention_backend.forward(q, k, v, context.kv_caches[cache_index], context.attn, scale)


@paged_attention.register_fake
def _paged_attention_shape(q: Tensor, k: Tensor, v: Tensor, cache_index: int, scale: float) -> Tensor:
    return torch.empty_like(q)


@torch.library.custom_op("openinfer::gated_deltanet", mutates_args=())
def gated_deltanet(x: Tensor, mixer_index: int) -> Tensor:
    """Gated DeltaNet layer ``mixer_index`` over the step's state slots: (n, hidden) -> (n, hidden)."""
    context = _context()
    assert context.attn.states is not None
    return context.mixers[mixer_index](x, context.attn.states)


@gated_deltanet.register_fake
def _gated_deltanet_shape(x: Tensor, mixer_index: int) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("openinfer::moe_experts", mutates_args=())
def moe_experts(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor) -> Tensor:
    """The step's experts kernel (kernels/moe.py's sum): (T, H) in hidden's dtype."""
    return _context().experts_backend.run(hidden, w13, w2, topk_weights, topk_ids)


@moe_experts.register_fake
def _moe_experts_shape(
    hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor
) -> Tensor:
    return torch.empty_like(hidden)


@torch.library.custom_op("openinfer::packed_matmul", mutates_args=())
def packed_matmul(x: Tensor, weight_t: Tensor, bias: Tensor | None, pack_index: int) -> Tensor:
    """x @ weight_t (+ bias) by packed weight ``pack_index`` (cpu_matmul.weight_matmul)."""
    return weight_matmul(x, weight_t, _context().packed[pack_index], bias)


@packed_matmul.register_fake
def _packed_matmul_shape(x: Tensor, weight_t: Tensor, bias: Tensor | None, pack_index: int) -> Tensor:
    return x.new_empty(x.shape[0], weight_t.shape[1])


def linear(
    x: Tensor,
    weight_t: Tensor,
    packed: PackedWeight | None,
    bias: Tensor | None,
    pack_index: int | None,
) -> Tensor:
    """x @ weight_t (+ bias): by the packed copy where there is one; traced by torch.compile with one
    (``pack_index`` given), the opaque op."""
    if pack_index is not None and torch.compiler.is_compiling():
        return torch.ops.openinfer.packed_matmul(x, weight_t, bias, pack_index)
    return weight_matmul(x, weight_t, packed, bias)


def attention(
    backend: AttentionBackend,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv_cache: Tensor | None,
    attn: AttentionMetadata | None,
    scale: float,
    cache_index: int,
) -> Tensor:
    """One layer's paged attention: the backend's kernel, or traced by torch.compile, the opaque op (the
    cache and metadata then come from the step context: ``kv_cache`` and ``attn`` are None)."""
    if torch.compiler.is_compiling():
        return torch.ops.openinfer.paged_attention(q, k, v, cache_index, scale)
    assert kv_cache is not None and attn is not None
    return backend.forward(q, k, v, kv_cache, attn, scale)


def experts(
    backend: ExpertsBackend, hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor
) -> Tensor:
    """The MoE experts' sum: the backend's kernel, or traced by torch.compile, the opaque op."""
    if torch.compiler.is_compiling():
        return torch.ops.openinfer.moe_experts(hidden, w13, w2, topk_weights, topk_ids)
    return backend.run(hidden, w13, w2, topk_weights, topk_ids)


def deltanet(mixer: Mixer, x: Tensor, attn: AttentionMetadata | None, mixer_index: int) -> Tensor:
    """A Gated DeltaNet layer's mixing: the layer itself over ``attn.states``, or traced by torch.compile,
    the opaque op (the step context's states)."""
    if torch.compiler.is_compiling():
        return torch.ops.openinfer.gated_deltanet(x, mixer_index)
    if attn is None or attn.states is None:
        raise ValueError("a Gated DeltaNet layer needs the step's state slots (attn.states)")
    return mixer(x, attn.states)
