"""The built-in model: a tiny Qwen3 trained on tinyshakespeare and the drafters distilled from it, shipped as
package data, each folder with its model card: `builtin/target/` (tools/train_target.py), `builtin/dflash/`
(z-lab's layout, tools/train_dflash.py), `builtin/dspark_block7/` and `builtin/dflash_block7/` (DeepSpec's
layout, tools/train_dspark.py), and the text all of them were trained on, `builtin/data/tinyshakespeare.txt`.
`openinfer-serve` serves the target with `dspark_block7/` when no model is given (and with `dflash/` for
`--spec-method dflash`)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

BUILTIN_MODEL_NAME = "openinfer-tiny-qwen3"  # the name clients ask for
BUILTIN_NUM_SPEC_TOKENS = 7  # K of the built-in drafter: its block is 8 slots, the current token and 7 masks


def builtin_target_folder() -> Path:
    """The built-in target's Hugging Face folder (config.json, model.safetensors, tokenizer files)."""
    return _builtin("target")


def is_builtin_target(folder: Path) -> bool:
    """Whether ``folder`` is the built-in target's (``openinfer-serve`` names it to its engines)."""
    return folder.resolve() == Path(str(files("openinfer.engine_core") / "builtin" / "target")).resolve()


BUILTIN_DRAFTERS = {"dflash": "dflash", "dspark": "dspark_block7"}  # --spec-method -> its built-in folder


def builtin_drafter_folder(method: str = "dflash") -> Path:
    """The built-in drafter of `method` (a key of BUILTIN_DRAFTERS): DFlash in z-lab's layout, DSpark in
    DeepSpec's (config.json, model.safetensors)."""
    return _builtin(BUILTIN_DRAFTERS[method])


def _builtin(name: str) -> Path:
    folder = Path(str(files("openinfer.engine_core") / "builtin" / name))
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{folder} has no model.safetensors: the built-in model is package data; reinstall openinfer "
            "(pip install -e .) from a complete checkout"
        )
    return folder


def builtin_text_path() -> Path:
    """tinyshakespeare (`builtin/data/`, public domain), the text the built-in model was trained on: the
    default of every command that cuts prompts from a text or trains (package data, like the weights)."""
    return Path(str(files("openinfer.engine_core") / "builtin" / "data" / "tinyshakespeare.txt"))


def builtin_tokenizer_folder() -> Path:
    """The folder holding the built-in tokenizer.json and tokenizer_config.json (``--fake-model``'s model)."""
    return Path(str(files("openinfer.engine_core") / "builtin"))
