"""How each --spec-method loads its drafter beside the target (``DRAFTERS``): n-gram lookup, and the block
drafters, whose checkpoint folder must be of the method named."""

from __future__ import annotations

from openinfer.engine_core.config import DrafterSpec, SpecMethod
from openinfer.engine_core.spec_decode.drafter import Drafter
from openinfer.engine_core.spec_decode.ngram import NgramDrafter
from openinfer.engine_core.worker.executor import ModelExecutor


def _load_ngram(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    return NgramDrafter(spec.num_spec_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)


def _load_dflash(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    return _load_block_drafter(spec, runner, dspark=False)


def _load_dspark(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    return _load_block_drafter(spec, runner, dspark=True)


def _load_block_drafter(spec: DrafterSpec, runner: ModelExecutor, *, dspark: bool) -> Drafter:
    """A DFlash or DSpark checkpoint beside the target; the folder's config must be the method's."""
    from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig
    from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
    from openinfer.engine_core.worker.model_runner import ModelRunner

    method = spec.method
    if spec.draft_model is None:
        raise ValueError(f"--spec-method {method} needs --draft-model PATH (a {method} checkpoint folder)")
    if not isinstance(runner, ModelRunner):  # block drafters share the target's embedding and LM head
        raise ValueError(f"--fake-model has no hidden states for {method}; use --spec-method ngram")
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
    drafter = DFlashDrafter(spec.draft_model, runner, spec.num_spec_tokens, anchor)
    if spec.confidence_threshold and not drafter.estimates_confidence:
        raise ValueError(
            f"--confidence-threshold needs a confidence head; {spec.draft_model} has none "
            "(enable_confidence_head is false)"
        )
    return drafter


DRAFTERS = {SpecMethod.NGRAM: _load_ngram, SpecMethod.DFLASH: _load_dflash, SpecMethod.DSPARK: _load_dspark}
