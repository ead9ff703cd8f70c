"""Greedy batches through an engine core with a drafter, as the speculative-decoding tests run them: the
tokens each prompt produced and its finished spec stats, docs/design.md's counter invariants checked on every
snapshot."""

from __future__ import annotations

from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.testing.engine_cores import CheckedSteps
from openinfer.protocol import EngineCoreRequest, SamplingParams

K = 7
# Per prompt: max_tokens, several of them cut a 7-token draft short.
MAX_TOKENS = [40, 5, 13, 40, 2, 9, 31, 17]


def run(core: EngineCore, prompts: list[list[int]], stop_token_ids: list[list[int]] | None = None):
    """All prompts as one batch at temperature 0; checks docs/design.md's counter invariants on every snapshot."""
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    stats = {}
    for i, prompt in enumerate(prompts):
        stops = stop_token_ids[i] if stop_token_ids else []
        params = SamplingParams(
            max_tokens=MAX_TOKENS[i], temperature=0.0, ignore_eos=True, stop_token_ids=stops
        )
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    steps = CheckedSteps(core)
    while core.has_work:
        for out in steps.step():
            outputs[out.request_id].extend(out.new_token_ids)
            if out.finish is not None:
                stats[out.request_id] = out.spec_stats
    return [outputs[str(i)] for i in range(len(prompts))], stats
