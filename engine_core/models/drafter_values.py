"""The values a block drafter's config.json may hold, read strictly before anything is sized from them.

A drafter folder may come from a client at run time (the admin API), so its config is refused, never
interpreted: every field has the JSON type its reader expects (``check_field_types``: a list where an object
is meant is a refusal naming it, never an AttributeError), JSON's ``1e9`` is a float and refused where a
count is meant (never truncated to 10⁹), a bool is no count, a NaN or infinity no scale, and every count
and id is bounded (``SIZE_LIMIT``), so that nothing computed from them runs away before the checks against
the target (``DFlashConfig.check_target``) and the memory budget (``spec_decode/drafter_budget.py``) see
them. Every float it may set is bounded too (``FLOAT_RANGES``): far past what any checkpoint uses, a scale
or a RoPE base makes the draft overflow at run time. Without torch: the launcher reads a folder's block
size through it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from openinfer.engine_core.models.config_sizes import SIZE_FIELDS
from openinfer.engine_core.models.model_folder import model_file
from openinfer.protocol import MAX_SPEC_TOKENS

DEEPSPEC_ARCHITECTURE = "Qwen3DSparkModel"  # DeepSpec's save_pretrained: DSpark and its DFlash drafters
ZLAB_BLOCK_SIZE = 16  # z-lab's DFlashDraftModel default when the config names no block_size
SIZE_LIMIT = 1 << 24  # counts, widths and token ids: Qwen3-class vocabularies are ~152K-262K, widths ~1K-16K
MAX_LAYERS = 1024  # decoder layers of a draft or target model: the deepest Qwen3-class models have under 100
MAX_BLOCK_SIZE = MAX_SPEC_TOKENS + 1  # a block: the current token's slot and at most K <= 32 drafts' slots
CONFIG_LIMIT_BYTES = 1 << 20  # a drafter's config.json is a few KB; a bigger one is not read
# The floats a drafter's config may set, each in [low, high], far past the values checkpoints use:
FLOAT_RANGES = {
    # multipliers of the block's embeddings and of the draft logits: 1 in z-lab's and DeepSpec's, and
    # within 1e-2..1e2 in every scaled model (Gemma's sqrt(hidden) embedding scale, muP logit multipliers)
    "input_embedding_scale": (1e-3, 1e3),
    "output_multiplier": (1e-3, 1e3),
    "final_logit_softcapping": (1e-3, 1e3),  # when > 0 (Gemma: 30); 0 or less: none, as in z-lab's code
    "rms_norm_eps": (1e-12, 1.0),  # Qwen3: 1e-6; one past float32's range is 0: an all-zero row gives NaN
    "rope_theta": (1.0, 1e12),  # Qwen3: 1e6, Qwen3.5: 1e7; a tiny one overflows the RoPE frequencies
    "sampled_confidence_temperature": (1e-3, 1e3),  # the T a sampled confidence head was fitted at
}


# The JSON type of every field besides the numbers that the drafter's readers look at (ModelConfig's Qwen3
# keys, z-lab's and DeepSpec's), when present and not null; and of the items of its arrays.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("model_type", "hidden_act", "dtype", "torch_dtype", "markov_head_type"), (str,)),
    **dict.fromkeys(("architectures", "layer_types", "target_layer_ids"), (list,)),
    **dict.fromkeys(("dflash_config", "rope_parameters", "rope_scaling"), (dict,)),
    **dict.fromkeys(
        ("is_causal", "causal", "use_sliding_window", "attention_bias", "tie_word_embeddings"), (bool,)
    ),
    **dict.fromkeys(("sample_from_anchor", "enable_confidence_head", "confidence_head_with_markov"), (bool,)),
    "eos_token_id": (int, list),
}
_ITEM_TYPES: dict[str, type] = {"architectures": str, "layer_types": str, "eos_token_id": int}
_JSON_NAMES = {str: "a string", list: "an array", dict: "an object", bool: "true or false", int: "an integer"}


def check_field_types(config: dict[str, Any]) -> None:
    """Refuse a field of ``config`` (a drafter's config.json, or its ``dflash_config``) that is not of the
    JSON type its reader expects, naming it (the numbers are checked where they are read: ``config_int``)."""
    for key, types in _FIELD_TYPES.items():
        value = config.get(key)
        if value is not None and not _is_json(value, types):
            names = " or ".join(_JSON_NAMES[t] for t in types)
            raise ValueError(f"{key} must be {names}, got {repr(value)[:80]} ({type(value).__name__})")
        item = _ITEM_TYPES.get(key)
        if item is not None and isinstance(value, list) and not all(_is_json(v, (item,)) for v in value):
            raise ValueError(f"every item of {key} must be {_JSON_NAMES[item]}, got {repr(value)[:80]}")


def _is_json(value: Any, types: tuple[type, ...]) -> bool:
    """Whether ``value`` is of one of ``types`` (a bool is no integer)."""
    return any(isinstance(value, t) and not (t is int and isinstance(value, bool)) for t in types)


def config_int(value: Any, key: str, low: int = 1, high: int = SIZE_LIMIT) -> int:
    """``value`` if it is a JSON integer in [low, high]; else ValueError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r} ({type(value).__name__})")
    if not low <= value <= high:
        raise ValueError(f"{key} must be in [{low}, {high}], got {value}")
    return value


def config_float(value: Any, key: str) -> float:
    """``value`` as a float if it is a finite JSON number; else ValueError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    return float(value)


def bounded_float(value: Any, key: str) -> float:
    """``value`` as a float if it is a finite JSON number within ``FLOAT_RANGES[key]``; else ValueError
    naming ``key`` and the range."""
    number = config_float(value, key)
    low, high = FLOAT_RANGES[key]
    if not low <= number <= high:
        raise ValueError(f"{key} must be in [{low:g}, {high:g}], got {value!r}")
    return number


def check_layer_values(config: dict[str, Any]) -> None:
    """The draft layers' Qwen3 numbers before ``ModelConfig`` reads them: every count present is an integer
    in [1, SIZE_LIMIT] (layers in [1, MAX_LAYERS]); ``rms_norm_eps`` and ``rope_theta`` are within their
    ``FLOAT_RANGES``."""
    for key in SIZE_FIELDS:  # the draft layers' Qwen3 counts; a null one is left to its default
        if config.get(key) is not None:
            config_int(config[key], key, high=MAX_LAYERS if key == "num_hidden_layers" else SIZE_LIMIT)
    rope = config.get("rope_parameters")
    thetas = [config.get("rope_theta"), rope.get("rope_theta") if isinstance(rope, dict) else None]
    for key, value in (("rms_norm_eps", config.get("rms_norm_eps")), *(("rope_theta", t) for t in thetas)):
        if value is not None:
            bounded_float(value, key)


def read_config(folder: Path) -> dict[str, Any]:
    """A drafter folder's config.json as a JSON object: a regular file of the folder (``model_file``: never a
    pipe, a device or a link out of it) of at most CONFIG_LIMIT_BYTES. FileNotFoundError when there is none,
    ValueError naming the file otherwise."""
    path = folder / "config.json"
    if not os.path.lexists(path):
        raise FileNotFoundError(
            f"{path} not found: --draft-model must be a DFlash checkpoint folder with config.json"
        )
    size = model_file(folder, "config.json").stat().st_size
    if size > CONFIG_LIMIT_BYTES:
        raise ValueError(f"{path} is {size} bytes; a drafter's config.json is at most {CONFIG_LIMIT_BYTES}")
    try:
        config = json.loads(path.read_bytes())
    except ValueError as e:  # not JSON, or not UTF-8
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return config
