"""A drafter from its ``--spec-method`` and checkpoint folder, without torch at import (the launcher and the
flag readers use the folder half).

Where a folder may come from: the admin API's load-drafter command names a folder on the engine's host, and
the engine loads it only if it lies under an allowed folder (``--allowed-drafter-dir``) once symlinks and
``..`` are resolved; its answers never tell the client whether a path exists: a refused path and a missing or
unreadable checkpoint read the same to it (the engine's log says which). What a folder asks for when the
command line does not say: ``folder_drafter``. How each method loads its drafter beside the target
(``DRAFTERS``): n-gram lookup, and the block drafters, whose folder must be of the method named and fit the
target (``block_drafter_config``, also what the engine checks at start before it sizes its KV cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from openinfer.engine_core.config import DrafterSpec, SpecMethod
from openinfer.engine_core.models.drafter_values import (
    DEEPSPEC_ARCHITECTURE,
    MAX_BLOCK_SIZE,
    ZLAB_BLOCK_SIZE,
    check_field_types,
    config_int,
    read_config,
)
from openinfer.protocol import DrafterMethod

if TYPE_CHECKING:
    from openinfer.engine_core.models.config import ModelConfig
    from openinfer.engine_core.models.dflash_config import DFlashConfig
    from openinfer.engine_core.spec_decode.drafter import Drafter
    from openinfer.engine_core.worker.executor import ModelExecutor

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


def _load_ngram(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    from openinfer.engine_core.spec_decode.ngram import NgramDrafter

    return NgramDrafter(spec.num_spec_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)


def _load_block_drafter(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    """A DFlash or DSpark checkpoint beside the target (``block_drafter_config``'s checks first)."""
    from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
    from openinfer.engine_core.worker.model_runner import ModelRunner
    from openinfer.engine_core.worker.parallel.rank_group import ParallelRunner

    if not isinstance(runner, ModelRunner | ParallelRunner):  # they share the target's embedding and head
        raise ValueError(f"--fake-model has no hidden states for {spec.method}; use --spec-method ngram")
    config = block_drafter_config(spec, runner.model_config)
    assert spec.draft_model is not None  # block_drafter_config refuses a spec without one
    if isinstance(
        runner, ParallelRunner
    ):  # N > 1: rank 0's whole copy, before the drafter's free-memory check
        runner.load_draft_head()
    drafter = DFlashDrafter(spec.draft_model, runner, spec.num_spec_tokens, config=config)
    if spec.confidence_threshold and not drafter.estimates_confidence:
        raise ValueError(
            f"--confidence-threshold needs a confidence head; {spec.draft_model} has none "
            "(enable_confidence_head is false)"
        )
    return drafter


def block_drafter_config(spec: DrafterSpec, target: ModelConfig) -> DFlashConfig:
    """The config of ``spec``'s DFlash or DSpark folder, read and checked as every load of it is, before
    anything is sized from it: of the method named (dspark for a DSpark checkpoint, else dflash), in the
    anchor layout asked for, fitting ``target`` (``drafter_fit.check_fits_target``). ValueError saying why not."""
    from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig
    from openinfer.engine_core.models.drafter_fit import check_fits_target

    method, dspark = spec.method, spec.method == SpecMethod.DSPARK
    if spec.draft_model is None:
        raise ValueError(f"--spec-method {method} needs --draft-model PATH (a {method} checkpoint folder)")
    anchor = AnchorLayout(spec.dflash_anchor) if spec.dflash_anchor else None
    config = DFlashConfig.from_folder(spec.draft_model, anchor)
    if config.is_dspark and not dspark:
        raise ValueError(
            f"{spec.draft_model} is a DSpark checkpoint (DeepSpec's Markov or confidence head): serve it with "
            "--spec-method dspark"
        )
    if dspark and not config.is_dspark:
        raise ValueError(
            f"{spec.draft_model} is not a DSpark checkpoint (a Qwen3DSparkModel config with markov_rank > 0 or "
            "enable_confidence_head): serve a DFlash drafter with --spec-method dflash"
        )
    check_fits_target(config, target)
    return config


DRAFTERS = {
    SpecMethod.NGRAM: _load_ngram,
    SpecMethod.DFLASH: _load_block_drafter,
    SpecMethod.DSPARK: _load_block_drafter,
}
