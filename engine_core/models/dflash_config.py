"""A block drafter's config.json, read and checked against its target: z-lab's DFlash layout, and DeepSeek's
DeepSpec layout (`Qwen3DSparkModel`: DSpark, and its DFlash drafters with `markov_rank` 0) whose heads
`dspark_heads.py` holds (the layouts: see :mod:`openinfer.engine_core.models.dflash`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.drafter_values import (
    DEEPSPEC_ARCHITECTURE,
    MAX_BLOCK_SIZE,
    MAX_LAYERS,
    ZLAB_BLOCK_SIZE,
    bounded_float,
    check_field_types,
    check_layer_values,
    config_float,
    config_int,
    read_config,
)
from openinfer.engine_core.models.dspark_heads import DSparkHeadsConfig, MarkovHeadType

_ZLAB_ARCHITECTURE = "DFlashDraftModel"
_UNSUPPORTED_EXTRAS = ("conv_kernel_size", "selector_rank", "projector_type")  # DFlash2 / Domino drafters


class AnchorLayout(enum.Enum):
    """Which slots of a draft block carry the drafts. In both, slot 0 holds the current token at its
    position p and slots 1.. hold mask tokens at p+1, ...

    Decided by `dflash_config.sample_from_anchor` when the config has it; else by an explicit choice (the
    engine's flag); else, for a config whose architectures name z-lab's `DFlashDraftModel`, by z-lab's
    reference code, which always uses MASK_SLOTS; anything else is an error."""

    MASK_SLOTS = "mask_slots"  # z-lab DFlash (sample_from_anchor false): slot i >= 1 drafts position p + i
    ANCHOR_SLOT = "anchor_slot"  # DSpark (sample_from_anchor true): slot i >= 0 drafts position p + i + 1

    @property
    def first_draft_slot(self) -> int:
        return 1 if self is AnchorLayout.MASK_SLOTS else 0

    def max_drafts(self, block_size: int) -> int:
        """The most draft tokens one block of `block_size` slots yields."""
        return block_size - self.first_draft_slot


@dataclass(frozen=True)
class DFlashConfig:
    """A DFlash drafter's architecture and block layout, from its `config.json`."""

    layers: ModelConfig  # the draft layers' Qwen3 sizes; vocab_size is the (shared) target vocabulary
    block_size: int  # slots in one draft block, the current token's included (not the KV-cache page size)
    mask_token_id: int  # token id in every slot but the first
    target_layer_ids: tuple[int, ...]  # 0-based target decoder layers whose outputs feed fc, in fc's order
    target_hidden_size: int  # width of one target layer's output
    num_target_layers: int | None  # decoder layers of the target it was trained for, when the config says
    anchor: AnchorLayout  # which block slots carry the drafts
    input_embedding_scale: float  # multiplies the target's embeddings of the block tokens (1 in z-lab's)
    output_multiplier: float = 1.0  # multiplies the draft logits (z-lab's compute_logits; 1 when absent)
    final_logit_softcapping: float | None = None  # logits -> tanh(logits / c) * c when set and > 0
    heads: DSparkHeadsConfig | None = (
        None  # DeepSpec's layout: its Markov and confidence heads; None: z-lab's
    )

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.anchor.max_drafts(self.block_size) < 1:
            raise ValueError(
                f"dflash: block_size {self.block_size} leaves no slot to draft from ({self.anchor})"
            )
        if not self.target_layer_ids or min(self.target_layer_ids) < 0:
            raise ValueError(
                f"dflash: target_layer_ids must be non-empty and >= 0, got {self.target_layer_ids}"
            )
        if self.num_target_layers is not None and max(self.target_layer_ids) >= self.num_target_layers:
            raise ValueError(
                f"dflash: target_layer_ids {self.target_layer_ids} name a layer past num_target_layers "
                f"({self.num_target_layers})"
            )
        if self.final_logit_softcapping is not None and not self.final_logit_softcapping > 0:
            raise ValueError(
                f"dflash: final_logit_softcapping must be > 0 or absent, got {self.final_logit_softcapping}"
            )
        if not 0 <= self.mask_token_id < self.layers.vocab_size:
            raise ValueError(
                f"dflash: mask_token_id {self.mask_token_id} is outside the vocabulary [0, "
                f"{self.layers.vocab_size})"
            )

    @property
    def max_drafts(self) -> int:
        """The most draft tokens one block yields: the largest K this drafter can serve."""
        return self.anchor.max_drafts(self.block_size)

    @classmethod
    def from_folder(cls, folder: Path | str, anchor: AnchorLayout | None = None) -> DFlashConfig:
        """Read `folder/config.json`; `anchor`, when given, is the layout the engine was told to use."""
        config_path = Path(folder) / "config.json"
        config = read_config(Path(folder))
        try:
            return cls.from_dict(config, anchor)
        except ValueError as e:
            raise ValueError(f"{config_path}: {e}") from e

    @classmethod
    def from_dict(cls, config: dict[str, Any], anchor: AnchorLayout | None = None) -> DFlashConfig:
        """Build from the parsed config.json. Keys are looked up in `dflash_config` first, then at the top
        level, as z-lab's code does. Every field's type and every number is checked before it is used
        (`drafter_values.py`)."""
        check_field_types(config)
        dflash = config.get("dflash_config") or {}
        check_field_types(dflash)

        def value(key: str) -> Any:
            return dflash.get(key, config.get(key))

        for key in _UNSUPPORTED_EXTRAS:
            if value(key):
                raise ValueError(f"{key!r} belongs to a DFlash2/Domino drafter, which is not supported")
        if config.get("is_causal") or dflash.get("causal"):
            raise ValueError("causal DFlash draft layers are not supported (the block must be non-causal)")
        if "sliding_attention" in (config.get("layer_types") or []):
            raise ValueError("sliding-window DFlash draft layers are not supported")
        if value("mask_token_id") is None:
            raise ValueError("the config has no 'mask_token_id' (in dflash_config or at the top level)")
        if config.get("model_type") != "qwen3":
            raise ValueError(
                f"model_type must be 'qwen3' (dense Qwen3 draft layers), got {config.get('model_type')!r}"
            )
        check_layer_values(config)
        layers = ModelConfig.from_dict(config)
        num_target_layers = value("num_target_layers")
        if num_target_layers is not None:
            num_target_layers = config_int(num_target_layers, "num_target_layers", high=MAX_LAYERS)
            if layers.num_hidden_layers > num_target_layers:
                raise ValueError(
                    f"num_hidden_layers {layers.num_hidden_layers} is more draft layers than the "
                    f"{num_target_layers} layers of the target it was trained for (num_target_layers)"
                )
        layer_ids = value("target_layer_ids")
        if layer_ids is None:  # z-lab's default: spread over the target's layers
            if num_target_layers is None:
                raise ValueError("the config has neither 'target_layer_ids' nor 'num_target_layers'")
            layer_ids = list(zlab_target_layer_ids(num_target_layers, layers.num_hidden_layers))
        if not isinstance(layer_ids, list):
            raise ValueError(f"target_layer_ids must be a list of integers, got {layer_ids!r}")
        block_size = value("block_size")
        if block_size is not None:  # a block holds the current token and at most MAX_SPEC_TOKENS drafts
            block_size = config_int(block_size, "block_size", high=MAX_BLOCK_SIZE)
        softcap = value("final_logit_softcapping")  # z-lab applies it only when it is set and > 0
        softcap = None if softcap is None else config_float(softcap, "final_logit_softcapping")
        if softcap is not None:
            softcap = bounded_float(softcap, "final_logit_softcapping") if softcap > 0 else None
        deepspec = DEEPSPEC_ARCHITECTURE in (config.get("architectures") or [])
        return cls(
            layers=layers,
            block_size=ZLAB_BLOCK_SIZE if block_size is None else block_size,
            mask_token_id=config_int(value("mask_token_id"), "mask_token_id", low=0),
            target_layer_ids=tuple(config_int(i, "target_layer_ids[]", low=0) for i in layer_ids),
            target_hidden_size=config_int(
                value("target_hidden_size") or layers.hidden_size, "target_hidden_size"
            ),
            num_target_layers=num_target_layers,
            anchor=_anchor_layout(config, value("sample_from_anchor"), anchor),
            input_embedding_scale=bounded_float(
                _number(value("input_embedding_scale"), 1.0), "input_embedding_scale"
            ),
            output_multiplier=bounded_float(_number(value("output_multiplier"), 1.0), "output_multiplier"),
            final_logit_softcapping=softcap,
            heads=_deepspec_heads(config) if deepspec else None,
        )

    @property
    def is_deepspec(self) -> bool:
        """Whether the checkpoint is in DeepSpec's layout (its own copies of the target's embedding and LM
        head beside the draft layers, and the DSpark heads when its markov_rank or confidence head say)."""
        return self.heads is not None

    @property
    def is_dspark(self) -> bool:
        """Whether it is a DSpark drafter (DeepSpec's layout with a Markov or a confidence head), served with
        ``--spec-method dspark``; DeepSpec's DFlash drafters and z-lab's are served as ``dflash``."""
        heads = self.heads
        return heads is not None and (heads.markov_rank > 0 or heads.confidence_head)

    def describe(self, num_spec_tokens: int) -> str:
        """The drafter in the engine's log: method, K, block size, layout and heads."""
        heads, size = self.heads, self.block_size
        if heads is not None and (heads.markov_rank or heads.confidence_head):
            markov = "no markov"
            if heads.markov_rank:
                markov = f"markov={heads.markov_head_type.value} r={heads.markov_rank}"
            confidence = "confidence head" if heads.confidence_head else "no confidence head"
            return f"dspark K={num_spec_tokens} block={size} ({markov}, {confidence})"
        layout = "deepspec" if heads is not None else self.anchor.value
        return f"dflash K={num_spec_tokens} block={size} ({layout})"


def zlab_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's default target layers: the middle one for one draft layer, else evenly from layer 1 to n - 3."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    span = end - start
    return tuple(round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


def _number(value: Any, default: float) -> Any:
    """A config number, `default` when the key is absent or null."""
    return default if value is None else value


def _anchor_layout(config: dict[str, Any], stated: Any, chosen: AnchorLayout | None) -> AnchorLayout:
    from_config = (
        None if stated is None else (AnchorLayout.ANCHOR_SLOT if stated else AnchorLayout.MASK_SLOTS)
    )
    if chosen is not None:
        if from_config not in (None, chosen):
            raise ValueError(
                f"the config's sample_from_anchor={stated} means {from_config.value}, but {chosen.value} was "
                "asked for; drop the explicit anchor layout"
            )
        return chosen
    if from_config is not None:
        return from_config
    if _ZLAB_ARCHITECTURE in (config.get("architectures") or []):
        return AnchorLayout.MASK_SLOTS  # z-lab's format: its reference code always drafts from mask slots
    if DEEPSPEC_ARCHITECTURE in (config.get("architectures") or []):
        return AnchorLayout.ANCHOR_SLOT  # DeepSpec: the anchor is the first prediction, W slots W drafts
    raise ValueError(
        "the config does not say which block slots carry the drafts (no dflash_config.sample_from_anchor, "
        f"and architectures names neither {_ZLAB_ARCHITECTURE} nor {DEEPSPEC_ARCHITECTURE}); choose the anchor "
        "layout explicitly"
    )


def _deepspec_heads(config: dict[str, Any]) -> DSparkHeadsConfig:
    """The heads of a DeepSpec config: `markov_rank` (0 or absent: none), `markov_head_type` (written only
    with a Markov head; vanilla when absent), `enable_confidence_head`, `confidence_head_with_markov`, and
    openinfer's `sampled_confidence_temperature` (a second confidence head for sampled requests)."""
    rank = config_int(_number(config.get("markov_rank"), 0), "markov_rank", low=0)
    head_type = config.get("markov_head_type") or MarkovHeadType.VANILLA.value
    if head_type not in set(MarkovHeadType):
        choices = ", ".join(MarkovHeadType)
        raise ValueError(f"markov_head_type {head_type!r} is not one of {choices}")
    confidence = bool(config.get("enable_confidence_head", False))
    return DSparkHeadsConfig(
        markov_rank=rank,
        markov_head_type=MarkovHeadType(head_type),
        confidence_head=confidence,
        confidence_with_markov=confidence and bool(config.get("confidence_head_with_markov", False)),
        sampled_confidence_temperature=_sampled_temperature(config),
    )


def _sampled_temperature(config: dict[str, Any]) -> float | None:
    """`sampled_confidence_temperature`: absent or null, else a number within its FLOAT_RANGES."""
    value = config.get("sampled_confidence_temperature")
    return None if value is None else bounded_float(value, "sampled_confidence_temperature")
