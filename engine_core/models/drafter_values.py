"""The numbers a block drafter's config.json may hold, read strictly before anything is sized from them.

A drafter folder may come from a client at run time (the admin API), so its config is refused, never
interpreted: JSON's ``1e9`` is a float and refused where a count is meant (never truncated to 10⁹), a bool
is no count, a NaN or infinity no scale, and every count and id is bounded (``SIZE_LIMIT``), so that nothing
computed from them runs away before the checks against the target (``DFlashConfig.check_target``) and the
memory budget (``spec_decode/drafter_budget.py``) see them. Without torch: the launcher reads a folder's
block size through it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from openinfer.protocol import MAX_SPEC_TOKENS

SIZE_LIMIT = 1 << 24  # counts, widths and token ids: Qwen3-class vocabularies are ~152K-262K, widths ~1K-16K
MAX_LAYERS = 1024  # decoder layers of a draft or target model: the deepest Qwen3-class models have under 100
MAX_BLOCK_SIZE = MAX_SPEC_TOKENS + 1  # a block: the current token's slot and at most K <= 32 drafts' slots
CONFIG_LIMIT_BYTES = 1 << 20  # a drafter's config.json is a few KB; a bigger one is not read

# The draft layers' Qwen3 counts (ModelConfig reads them as they are); a null count is left to its default.
_LAYER_COUNTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


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


def positive_float(value: Any, key: str) -> float:
    """``value`` as a float if it is a finite JSON number > 0; else ValueError naming ``key``."""
    number = config_float(value, key)
    if not number > 0:
        raise ValueError(f"{key} must be > 0, got {value!r}")
    return number


def check_layer_values(config: dict[str, Any]) -> None:
    """The draft layers' Qwen3 numbers before ``ModelConfig`` reads them: every count present is an integer
    in [1, SIZE_LIMIT] (layers in [1, MAX_LAYERS]); ``rms_norm_eps`` and ``rope_theta`` are finite and > 0."""
    for key in _LAYER_COUNTS:
        if config.get(key) is not None:
            config_int(config[key], key, high=MAX_LAYERS if key == "num_hidden_layers" else SIZE_LIMIT)
    rope = config.get("rope_parameters")
    thetas = [config.get("rope_theta"), rope.get("rope_theta") if isinstance(rope, dict) else None]
    for key, value in (("rms_norm_eps", config.get("rms_norm_eps")), *(("rope_theta", t) for t in thetas)):
        if value is not None:
            positive_float(value, key)


def read_config_text(path: Path) -> str:
    """The text of a drafter's config.json: a regular file of at most CONFIG_LIMIT_BYTES (never a pipe or
    a device, which could block the load or fill memory)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: --draft-model must be a DFlash checkpoint folder with config.json"
        )
    size = path.stat().st_size
    if size > CONFIG_LIMIT_BYTES:
        raise ValueError(f"{path} is {size} bytes; a drafter's config.json is at most {CONFIG_LIMIT_BYTES}")
    return path.read_text()
