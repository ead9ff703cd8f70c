"""The engine's speculative-decoding state: the loaded drafter, its counters and the spec log."""

from __future__ import annotations

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.core.request import Request
from openinfer.engine_core.spec_decode.drafter import Drafter, DraftQuery
from openinfer.engine_core.spec_decode.ngram import NgramDrafter
from openinfer.engine_core.spec_decode.spec_log import SpecLog
from openinfer.engine_core.worker.executor import ModelExecutor
from openinfer.protocol import SpecDecodeCounters


def _load_ngram(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    return NgramDrafter(spec.num_spec_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)


def _load_dflash(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    from openinfer.engine_core.models.dflash_config import AnchorLayout
    from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
    from openinfer.engine_core.worker.model_runner import ModelRunner

    if spec.draft_model is None:
        raise ValueError("--spec-method dflash needs --draft-model PATH (a DFlash checkpoint folder)")
    if not isinstance(runner, ModelRunner):  # DFlash shares the target's embedding and LM head
        raise ValueError("--fake-model has no hidden states for DFlash; use --spec-method ngram")
    anchor = AnchorLayout(spec.dflash_anchor) if spec.dflash_anchor else None
    return DFlashDrafter(spec.draft_model, runner, spec.num_spec_tokens, anchor)


DRAFTERS = {"ngram": _load_ngram, "dflash": _load_dflash}


class SpecDecoder:
    """One loaded drafter and the cumulative counters of its K (DESIGN.md, counter semantics).

    ``generation`` tells requests prefilled under this drafter from older ones: a drafter that reads the
    target's hidden states (DFlash) can only draft for requests whose whole context it has seen.
    """

    def __init__(self, spec: DrafterSpec, runner: ModelExecutor, log: SpecLog | None) -> None:
        self.counters = SpecDecodeCounters.zero(spec.num_spec_tokens)  # refuses K outside [1, 32] first
        if spec.method not in DRAFTERS:
            raise ValueError(f"unknown --spec-method {spec.method!r}; choose one of {sorted(DRAFTERS)}")
        self.drafter = DRAFTERS[spec.method](spec, runner)
        self.num_spec_tokens = spec.num_spec_tokens
        self.generation = 0  # set when the engine installs it
        self._log = log

    def describe(self) -> str:
        return self.drafter.describe()

    def can_draft(self, request: Request) -> bool:
        """Whether this drafter may propose for ``request`` (its stats K and context fit this drafter)."""
        counters = request.spec_counters
        if counters is not None and counters.num_spec_tokens != self.num_spec_tokens:
            return False
        return not self.drafter.aux_layer_ids or request.drafter_generation == self.generation

    def query(self, request: Request, max_model_len: int) -> DraftQuery:
        """Drafts never run past max_tokens or the model length: the bonus token always comes on top."""
        params = request.sampling_params
        room = min(params.max_tokens - request.num_output_tokens, max_model_len - request.num_tokens) - 1
        return DraftQuery(
            request.all_token_ids[-1],
            request.num_tokens - 1,
            request.block_ids,
            max(0, min(self.num_spec_tokens, room)),
            request.all_token_ids,
        )

    def observe(self, request: Request, num_draft_tokens: int, num_accepted: int) -> None:
        """Count one verified draft in the engine counters, the request's stats and the spec log."""
        self.counters.observe_draft(num_draft_tokens, num_accepted)
        if request.spec_counters is None:
            request.spec_counters = SpecDecodeCounters.zero(self.num_spec_tokens)
        request.spec_counters.observe_draft(num_draft_tokens, num_accepted)  # the same tally, per request
        if self._log is not None:
            self._log.write(request.request_id, self.num_spec_tokens, num_draft_tokens, num_accepted)
