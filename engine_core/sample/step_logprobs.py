"""Per request, the logprobs of the tokens a step sampled for it (OpenAI's ``logprobs``), from the step's logits."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from openinfer.engine_core.core.scheduler_output import ScheduledRequest
from openinfer.kernels.logprobs import token_logprobs
from openinfer.protocol import TokenLogprobs


def sampled_logprobs(
    logits: Tensor, sampling: Sequence[ScheduledRequest], starts: Sequence[int], sampled: list[list[int]]
) -> list[list[TokenLogprobs] | None]:
    """Per sampling request, the logprobs of the tokens it sampled (None where it did not ask for them).

    Request i's logits rows are its len(drafts) + 1 verified positions from ``starts[i]`` on (see ``verify``):
    its j-th sampled token, an accepted draft token or the target's own, comes from its row j.
    """
    asked = [i for i, s in enumerate(sampling) if s.request.sampling_params.logprobs is not None]
    out: list[list[TokenLogprobs] | None] = [None] * len(sampling)
    if not asked:
        return out
    wanted = [(sampling[i], sampled[i], starts[i]) for i in asked]
    rows = [r for _, tokens, start in wanted for r in range(start, start + len(tokens))]
    token_ids = [t for _, tokens, _ in wanted for t in tokens]
    num_top = max(s.request.sampling_params.logprobs or 0 for s, _, _ in wanted)
    computed = token_logprobs(logits, rows, token_ids, num_top)
    i = 0  # index into computed
    for b, (s, tokens, _) in zip(asked, wanted, strict=True):
        k = s.request.sampling_params.logprobs or 0
        out[b] = [
            TokenLogprobs(computed.sampled[j], computed.top_token_ids[j][:k], computed.top_logprobs[j][:k])
            for j in range(i, i + len(tokens))
        ]
        i += len(tokens)
    return out
