"""The built-in model: a tiny Qwen3 trained on tinyshakespeare and a DFlash drafter distilled from it, shipped
as package data (`builtin/target/`, `builtin/dflash/`; made by tools/train_target.py and tools/train_dflash.py,
each folder with its model card). `openinfer-serve` serves the pair when no model is given."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

BUILTIN_MODEL_NAME = "openinfer-tiny-qwen3"  # the name clients ask for
BUILTIN_NUM_SPEC_TOKENS = 7  # K of the built-in drafter: its block is 8 slots, the current token and 7 masks


def builtin_target_folder() -> Path:
    """The built-in target's Hugging Face folder (config.json, model.safetensors, tokenizer files)."""
    return _builtin("target")


def builtin_drafter_folder() -> Path:
    """The built-in DFlash drafter's folder, in z-lab's layout (config.json, model.safetensors)."""
    return _builtin("dflash")


def _builtin(name: str) -> Path:
    folder = Path(str(files("openinfer.engine_core") / "builtin" / name))
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{folder} has no model.safetensors: the built-in model is package data; reinstall openinfer "
            "(pip install -e .) from a complete checkout"
        )
    return folder


def builtin_tokenizer_folder() -> Path:
    """The folder holding the built-in tokenizer.json and tokenizer_config.json (``--fake-model``'s model)."""
    return Path(str(files("openinfer.engine_core") / "builtin"))
