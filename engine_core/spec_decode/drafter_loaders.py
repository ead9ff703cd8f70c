"""How each --spec-method loads its drafter beside the target (``DRAFTERS``): n-gram lookup, and the block
drafters, whose checkpoint folder must be of the method named and fit the target (``block_drafter_config``,
also what the engine checks at start before it sizes its KV cache from the folder)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from openinfer.engine_core.config import DrafterSpec, SpecMethod
from openinfer.engine_core.spec_decode.drafter import Drafter
from openinfer.engine_core.spec_decode.ngram import NgramDrafter
from openinfer.engine_core.worker.executor import ModelExecutor

if TYPE_CHECKING:
    from openinfer.engine_core.models.config import ModelConfig
    from openinfer.engine_core.models.dflash_config import DFlashConfig


def _load_ngram(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    return NgramDrafter(spec.num_spec_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)


def _load_block_drafter(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    """A DFlash or DSpark checkpoint beside the target (``block_drafter_config``'s checks first)."""
    from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
    from openinfer.engine_core.worker.model_runner import ModelRunner

    if not isinstance(runner, ModelRunner):  # block drafters share the target's embedding and LM head
        raise ValueError(f"--fake-model has no hidden states for {spec.method}; use --spec-method ngram")
    config = block_drafter_config(spec, runner.model_config)
    assert spec.draft_model is not None  # block_drafter_config refuses a spec without one
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
