"""Where drafters loaded at run time may come from (``--allowed-drafter-dir``), and what a drafter folder
asks for when the command line does not say (without torch: the launcher reads it).

The admin API's load-drafter command names a folder on the engine's host. The engine loads it only if it
lies under an allowed folder once symlinks and ``..`` are resolved, and its answers never tell the client
whether a path exists: a refused path and a missing or unreadable checkpoint read the same to it (the
engine's log says which).
"""

from __future__ import annotations

from pathlib import Path

from openinfer.engine_core.models.drafter_values import (
    DEEPSPEC_ARCHITECTURE,
    MAX_BLOCK_SIZE,
    ZLAB_BLOCK_SIZE,
    check_field_types,
    config_int,
    read_config,
)
from openinfer.protocol import DrafterMethod

NOT_ALLOWED = (
    "draft_model {path!r} is not under a folder this engine loads drafters from (--allowed-drafter-dir)"
)
CANNOT_LOAD = "cannot load a drafter from the path given ({path!r}); the engine's log says why"


def default_drafter_folders(model_path: Path, draft_model: Path | None) -> tuple[Path, ...]:
    """The folders that hold the engine's model and its start-time draft model (for the built-in pair:
    the package's ``builtin/`` folder, which holds both). A filesystem root is never a default."""
    folders: list[Path] = []
    for checkpoint in (model_path, draft_model):
        if checkpoint is None:
            continue
        parent = checkpoint.resolve().parent
        if parent != Path(parent.anchor) and parent not in folders:
            folders.append(parent)
    return tuple(folders)


def is_allowed(draft_model: str, allowed: tuple[Path, ...]) -> bool:
    """Whether ``draft_model`` (as the client sent it; relative to the engine's working folder) resolves
    to a path inside one of ``allowed``. Nothing is read but the links on the way."""
    try:
        path = Path(draft_model).resolve()
    except (OSError, ValueError):  # a NUL byte, a loop of links: no folder holds it
        return False
    return any(path.is_relative_to(folder.resolve()) for folder in allowed)


def folder_drafter(folder: Path) -> tuple[DrafterMethod, int]:
    """The ``--spec-method`` a block-drafter folder is served with when none is given (dspark for DeepSpec's
    ``Qwen3DSparkModel`` with a Markov or a confidence head, else dflash), and its K when none is given: a
    DeepSpec block's ``block_size`` drafts (DeepSpec verifies them all), z-lab's ``block_size - 1`` (its
    ``dflash_generate`` verifies the current token and block_size - 1 drafts). ValueError when the folder
    has no readable config.json."""
    try:
        config = read_config(folder)
    except (OSError, ValueError) as e:
        raise ValueError(f"--draft-model {folder}: cannot read its config.json ({e})") from e
    try:
        check_field_types(config)
        dflash = config.get("dflash_config") or {}
        check_field_types(dflash)
        block_size = dflash.get("block_size", config.get("block_size"))
        if block_size is not None:
            block_size = config_int(block_size, "block_size", high=MAX_BLOCK_SIZE)
    except ValueError as e:
        raise ValueError(f"--draft-model {folder}: {e}") from e
    block_size = ZLAB_BLOCK_SIZE if block_size is None else block_size
    if DEEPSPEC_ARCHITECTURE not in (config.get("architectures") or []):
        return "dflash", max(block_size - 1, 1)
    dspark = bool(config.get("markov_rank")) or bool(config.get("enable_confidence_head"))
    return ("dspark" if dspark else "dflash"), block_size
