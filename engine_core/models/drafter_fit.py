"""Whether a block drafter's config fits the target it is loaded beside, checked before anything is allocated.

A DFlash or DSpark drafter is a few Qwen3 layers that read the target's hidden states and draft through the
target's embedding and LM head. So its hidden size and vocabulary are the target's, it is no deeper than
the target, and the layers it reads are the target's. Its attention and MLP widths may differ from the
target's (z-lab's Qwen3.5 drafters are Qwen3 layers with other head counts than their hybrid targets), so
they are bounded by its hidden size instead, far above every Qwen3-class shape: they set the activations of
every draft step, which the engine's memory was not sized for, and which no parameter budget alone bounds (a
layer of many narrow heads holds few parameters and still needs large attention activations). What the
layers then weigh is the memory budget's to judge (``spec_decode/drafter_budget.py``)."""

from __future__ import annotations

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash_config import DFlashConfig

# A draft layer's query width (heads x head_dim) and MLP width, as multiples of its hidden size: Qwen3's
# widest are 2x for the queries (Qwen3-0.6B, 16 x 128 over 1024) and 5x for the MLP (Qwen3-32B).
MAX_WIDTH_RATIO = 8
# The widest attention head a drafter may have, unless its target's is wider (Qwen3: 128; Qwen3.5: 256): its
# RoPE table holds head_dim values for each of the target's positions.
MAX_HEAD_DIM = 256


def check_fits_target(config: DFlashConfig, target: ModelConfig) -> None:
    """Refuse a target this drafter cannot serve, saying what does not fit (before anything is allocated)."""
    problems = target_misfits(config, target)
    if problems:
        raise ValueError("this DFlash drafter does not fit the target model: " + "; ".join(problems))


def target_misfits(config: DFlashConfig, target: ModelConfig) -> list[str]:
    """What in ``config`` does not fit ``target`` (empty when it fits), each naming the value and the bound."""
    layers, problems = config.layers, []
    if layers.hidden_size != target.hidden_size or config.target_hidden_size != target.hidden_size:
        problems.append(
            f"the draft's hidden_size {layers.hidden_size} (target_hidden_size {config.target_hidden_size}) "
            f"must equal the target's {target.hidden_size}: it shares the target's embedding and LM head"
        )
    if layers.vocab_size != target.vocab_size:
        problems.append(
            f"vocab_size {layers.vocab_size} must equal the target's {target.vocab_size}: it drafts through "
            "the target's embedding and LM head"
        )
    if config.mask_token_id >= target.vocab_size:
        problems.append(f"mask_token_id {config.mask_token_id} is past the target's vocabulary")
    if layers.num_hidden_layers > target.num_hidden_layers:
        problems.append(
            f"num_hidden_layers {layers.num_hidden_layers}: a drafter is no deeper than its target "
            f"({target.num_hidden_layers} layers)"
        )
    if config.num_target_layers not in (None, target.num_hidden_layers):
        problems.append(
            f"it was trained on a {config.num_target_layers}-layer target, this one has "
            f"{target.num_hidden_layers}"
        )
    ids = config.target_layer_ids
    if max(ids) >= target.num_hidden_layers:
        problems.append(
            f"target_layer_ids {_short(ids)} name a layer the target lacks: it has {target.num_hidden_layers} (ids "
            f"0..{target.num_hidden_layers - 1})"
        )
    if len(ids) > target.num_hidden_layers:
        problems.append(f"target_layer_ids name {len(ids)} layers; the target has {target.num_hidden_layers}")
    problems += _size_misfits(config, target)
    return problems


def _size_misfits(config: DFlashConfig, target: ModelConfig) -> list[str]:
    """The draft layers' widths and the Markov head's rank past their bounds."""
    layers, problems = config.layers, []
    widest = MAX_WIDTH_RATIO * target.hidden_size
    for name, width in (
        ("num_attention_heads x head_dim", layers.q_width),
        ("intermediate_size", layers.intermediate_size),
    ):
        if width > widest:
            problems.append(f"{name} is {width}, more than {MAX_WIDTH_RATIO} x the hidden size ({widest})")
    if layers.head_dim > max(MAX_HEAD_DIM, target.head_dim):
        problems.append(
            f"head_dim {layers.head_dim} is wider than {max(MAX_HEAD_DIM, target.head_dim)} (the target's "
            f"{target.head_dim}, or {MAX_HEAD_DIM})"
        )
    heads = config.heads
    if heads is not None and heads.markov_rank > target.vocab_size:
        problems.append(
            f"markov_rank {heads.markov_rank} is more than the vocabulary ({target.vocab_size}): the Markov "
            "head is a low-rank factorisation of a vocabulary x vocabulary matrix"
        )
    return problems


def _short(ids: tuple[int, ...]) -> str:
    """The ids as a tuple, the first 8 of a longer one then '...'."""
    return str(ids) if len(ids) <= 8 else f"{str(ids[:8])[:-1]}, ...)"
