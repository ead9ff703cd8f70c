"""The ``n`` choices of one HTTP request: one engine request each, merged into one response or stream.

As vLLM's ``ParentRequest`` fans a request out (vllm/v1/engine/parallel_sampling.py): with n > 1, choice i
runs as its own engine request ``f"{i}_{request_id}"`` whose seed, when the request has one, is seed + i; with
n = 1 the request runs as it is. Each child is an ordinary engine request, so each drafts, is counted, logged
and reported on its own, and its outputs reach the client in the order they arrive, under its choice's index.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import msgspec

from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.metrics.spec_decode.per_request import PerRequestSpecMetrics
from openinfer.frontend.openai.completion_delta import CompletionDelta, Usage
from openinfer.frontend.openai.generation import Generation
from openinfer.frontend.openai.prepared_request import PreparedRequest
from openinfer.frontend.openai.response_format import (
    FormatContext,
    ResponseExtras,
    ResponseFormat,
    ResponseIds,
)
from openinfer.frontend.openai.sampling_options import SamplingOptions
from openinfer.protocol import EngineCoreRequest

# What a child's pump hands the merge: a delta of choice i, None once choice i is done, or what failed it.
_Event = tuple[int, CompletionDelta | Exception | None]


def child_requests(request: EngineCoreRequest, n: int) -> list[EngineCoreRequest]:
    """The engine requests of ``n`` choices of ``request``: itself for one, else vLLM's children (ids
    ``f"{i}_{request_id}"``, seed + i where it has a seed)."""
    if n == 1:
        return [request]
    params, seed = request.sampling_params, request.sampling_params.seed
    return [
        msgspec.structs.replace(
            request,
            request_id=f"{i}_{request.request_id}",
            sampling_params=params if seed is None else msgspec.structs.replace(params, seed=seed + i),
        )
        for i in range(n)
    ]


class Choices:
    """One request's choices from admission to the last chunk: their :class:`Generation` s, each shaped by a
    format of its own (its index, text offsets, reasoning parser), merged into one body or stream.

    Use as ``async with``. Entering sends choice 0; with n > 1 it waits until choice 0's first output, the
    sign that its prompt was computed and its full blocks are in the engine's prefix cache with the drafter's
    context, then sends the others to that engine when it can take them (another one when it cannot: past
    its queue bound, or gone), where they start from those blocks. (The engine caches a block when the step
    that computes it is scheduled, but a block drafter's context is written after that step, so children
    admitted in choice 0's own step would compute the prompt again.) Every child is sent before the response
    starts: an engine that refuses one (overloaded, gone) is the whole request's 503, never a broken stream.
    Leaving aborts every child still running on its engine: the client went away, or one child failed
    (:meth:`response` and :meth:`chunks` raise its :class:`EngineRequestError`).
    """

    def __init__(
        self,
        client: EngineClient,
        metrics: FrontendMetrics,
        model: ServedModel,
        prepared: PreparedRequest,
        options: SamplingOptions,
        arrival: float,
        ids: ResponseIds,
        spec_metrics: PerRequestSpecMetrics,
    ) -> None:
        request = prepared.engine_request
        self.request_id = request.request_id  # the engine request id of n = 1, the children's suffix
        self._metrics = metrics
        self._model_name = model.name
        self._generations = [
            Generation(client, metrics, model, child, options, arrival)
            for child in child_requests(request, options.n)
        ]
        extras = ResponseExtras(options.include_usage, spec_metrics, metrics_per_choice=options.n > 1)
        self._formats: list[ResponseFormat] = [
            prepared.response_format(
                FormatContext(
                    ids, model.tokenizer, request.prompt_token_ids, options.return_token_ids, extras, index
                )
            )
            for index in range(options.n)
        ]
        self._exits = AsyncExitStack()  # the children sent, each aborted on leaving unless it finished
        self._events: asyncio.Queue[_Event] = asyncio.Queue()
        self._pumps: list[asyncio.Task[None]] = []
        self._first_answered = asyncio.Event()  # choice 0's first output came, or it ended
        self._failed = False  # a child's pump caught an error

    @property
    def usage(self) -> Usage:
        """The request's usage, as vLLM counts it: the prompt once (its cached tokens as choice 0 found them,
        the one sent first), the completion tokens of every choice."""
        first = self._generations[0]
        completion_tokens = sum(g.num_output_tokens for g in self._generations)
        return Usage(first.num_prompt_tokens, completion_tokens, first.num_cached_tokens)

    async def response(self) -> dict[str, Any]:
        """The whole response (non-streamed), its choices in index order; raises :class:`EngineRequestError`
        when a child fails."""
        deltas: list[list[CompletionDelta]] = [[] for _ in self._generations]
        async for index, delta in self._deltas():
            deltas[index].append(delta)
        usage = self.usage
        bodies = [f.response(d, usage) for f, d in zip(self._formats, deltas, strict=True)]
        # Each body is the whole response as seen from its one choice (the same ids, usage and prompt).
        body = bodies[0]
        body["choices"] = [choice for b in bodies for choice in b["choices"]]
        return body

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The stream's chunks as the choices' outputs arrive, each choice finishing in a chunk of its own,
        then the usage chunk if asked; raises :class:`EngineRequestError` when a child fails."""
        async for index, delta in self._deltas():
            for chunk in self._formats[index].chunks(delta):
                yield chunk
        usage_chunk = self._formats[0].usage_chunk(self.usage)
        if usage_chunk is not None:
            yield usage_chunk

    async def __aenter__(self) -> Choices:
        try:
            await self._exits.enter_async_context(self._generations[0])
            if len(self._generations) > 1:
                self._pump(0)
                await self._first_answered.wait()
                for index, generation in enumerate(self._generations[1:], start=1):
                    if self._failed:  # the request fails with choice 0's error: send no more
                        break
                    generation.prefer_engine = self._generations[0].engine_index  # where its prompt is cached
                    await self._exits.enter_async_context(generation)
                    self._pump(index)
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._metrics.observe_request_params_n(self._model_name, len(self._generations))
        await self._close()

    async def _close(self) -> None:
        """Leave every child sent (aborting those still running), then wait for the pumps to stop.

        In that order: a client that resets its stream makes a write raise, and aiohttp cancels the handler
        when the loop next sees the connection lost, i.e. at the first await of leaving. The aborts suspend
        nowhere (an abort is sent without waiting), so they are all sent before that await; waiting for the
        pumps first let the cancellation skip them, and every choice ran on to its last token (issue 39).
        """
        for pump in self._pumps:
            pump.cancel()  # each stops at its next await, which it has not reached yet
        try:
            await self._exits.aclose()
        finally:
            await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _deltas(self) -> AsyncIterator[tuple[int, CompletionDelta]]:
        """Every choice's deltas with its index, in arrival order, until each choice has finished."""
        if not self._pumps:  # one choice: read it directly
            async for delta in self._generations[0].deltas():
                yield 0, delta
            return
        running = len(self._generations)
        while running:
            index, event = await self._events.get()
            if event is None:
                running -= 1
            elif isinstance(event, CompletionDelta):
                yield index, event
            else:
                raise event

    def _pump(self, index: int) -> None:
        """Start moving choice ``index``'s deltas into the merge."""
        self._pumps.append(asyncio.create_task(self._run_pump(index)))

    async def _run_pump(self, index: int) -> None:
        try:
            async for delta in self._generations[index].deltas():
                self._events.put_nowait((index, delta))
                if index == 0:
                    self._first_answered.set()
            self._events.put_nowait((index, None))
        except Exception as e:  # noqa: BLE001 - raised to the reader of the merge, whatever it is
            self._failed = True
            self._events.put_nowait((index, e))
        finally:
            if index == 0:
                self._first_answered.set()
