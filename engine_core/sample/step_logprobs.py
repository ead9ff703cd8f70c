"""Per request, the logprobs of the tokens a step sampled for it (OpenAI's ``logprobs``), computed on the device
from the step's logits and its verified tokens; read back with the rest of the step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from openinfer.engine_core.scheduler_output import ScheduledRequest
from openinfer.kernels.host_copy import host_to_device
from openinfer.kernels.logprobs import logprob_table, read_row
from openinfer.protocol import TokenLogprobs


@dataclass(frozen=True)
class StepLogprobs:
    """The logprobs table of the sampling requests that asked for logprobs, on the device, and its layout.

    Request ``asked[a]`` has ``widths[a]`` (its drafts + 1) consecutive rows of ``table``, one per verified
    position: its j-th kept token, an accepted draft or the target's own, is its row j. Only the rows of the
    tokens it keeps are read (its accepted count + 1); the others were computed for tokens it did not keep.
    """

    table: Tensor  # (sum(widths), 1 + 2 * num_top) float64, see logprob_table
    asked: list[int]  # indexes into the step's sampling requests, in order
    widths: list[int]
    num_tops: list[int]  # what each asked request wants (<= num_top)
    num_top: int  # columns of top entries in the table

    def read(
        self, flat: list[float], num_tokens: list[int], num_sampling: int
    ) -> list[list[TokenLogprobs] | None]:
        """Per sampling request, the logprobs of its ``num_tokens[i]`` tokens (None where it did not ask),
        from the table read back (``flat``, row after row)."""
        out: list[list[TokenLogprobs] | None] = [None] * num_sampling
        columns = 1 + 2 * self.num_top
        first = 0  # the request's first row
        for i, width, k in zip(self.asked, self.widths, self.num_tops, strict=True):
            entries = []
            for r in range(first, first + num_tokens[i]):
                row = read_row(flat[r * columns : (r + 1) * columns], self.num_top)
                entries.append(TokenLogprobs(row.sampled, row.top_token_ids[:k], row.top_logprobs[:k]))
            out[i] = entries
            first += width
        return out


def step_logprobs(
    logits: Tensor, sampling: Sequence[ScheduledRequest], starts: Sequence[int], tokens: Tensor
) -> StepLogprobs | None:
    """The logprobs of the verified tokens ``tokens`` (R, W) int64 on the device (see ``Verified``) at every
    verified position of the requests that ask for logprobs; None when none asks (such a step costs one pass
    over its requests)."""
    asked = [i for i, s in enumerate(sampling) if s.request.sampling_params.logprobs is not None]
    if not asked:
        return None
    widths = [len(sampling[i].spec_token_ids) + 1 for i in asked]
    rows = [r for i, w in zip(asked, widths, strict=True) for r in range(starts[i], starts[i] + w)]
    # (request, column) of each row's token in ``tokens``
    where = [(i, j) for i, w in zip(asked, widths, strict=True) for j in range(w)]
    index = host_to_device([i * tokens.shape[1] + j for i, j in where], torch.int64, tokens.device)
    num_tops = [sampling[i].request.sampling_params.logprobs or 0 for i in asked]
    num_top = max(num_tops)
    table = logprob_table(logits, rows, tokens.flatten()[index], num_top)
    return StepLogprobs(table, asked, widths, num_tops, num_top)
