"""Steps built from per-request chunks, for tests, tools and benchmarks that run a model runner directly
(``SeqChunk`` and its steps live in ``worker/step_batch.py``: the engine profiles its step costs with them);
and the decision of a decode step, for benchmarks that gather it the way the engine does (``InputBatch``)."""

from __future__ import annotations

from openinfer.engine_core.request import Request
from openinfer.engine_core.scheduler_output import ScheduledRequest
from openinfer.engine_core.worker.step_batch import SeqChunk, chunk_step, step_of_chunks
from openinfer.protocol import SamplingParams

__all__ = ["SeqChunk", "chunk_step", "decoding_requests", "step_of_chunks"]


def decoding_requests(prompts: list[list[int]], tables: list[list[int]]) -> list[ScheduledRequest]:
    """A decode step as the scheduler decides it: request b holds ``prompts[b]`` with all but its last token
    computed into the blocks ``tables[b]``, and runs that token."""
    scheduled = []
    for b, (prompt, table) in enumerate(zip(prompts, tables, strict=True)):
        request = Request(f"r{b}", list(prompt), SamplingParams(max_tokens=1), 0.0, len(prompt) + 1)
        request.block_ids = list(table)
        request.num_computed_tokens = len(prompt) - 1
        scheduled.append(ScheduledRequest.of(request, 1))
    return scheduled
