"""One completion running on an engine, seen as text deltas."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType

from openinfer.frontend.engine_client import EngineClient
from openinfer.frontend.engine_registry import ServedModel
from openinfer.frontend.metrics import FrontendMetrics
from openinfer.frontend.request_stream import RequestStream
from openinfer.frontend.tokenizer import IncrementalDetokenizer
from openinfer.protocol import EngineCoreOutput, EngineCoreRequest, RequestSpecStats

# Finish kinds that end a request normally; any other ("error", "abort", unknown) is an engine error.
_NORMAL_FINISHES = ("stop", "length")


class EngineRequestError(Exception):
    """The engine ended the request with an error, or died while running it; the message says which."""


@dataclass(frozen=True)
class CompletionDelta:
    """What one engine output adds to a completion."""

    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" or "length" on the last delta, else None
    stop_reason: int | None  # the stop token id from the request's stop_token_ids that ended it (vLLM's)
    spec_stats: RequestSpecStats | None = None  # on the last delta, when the engine had a drafter


class Generation:
    """Sends one request, turns its outputs into :class:`CompletionDelta` s and observes its metrics.

    Use as ``async with``: entering sends the request (``NoEngineError`` if no engine takes it); leaving
    before the last delta (the client went away, the handler was cancelled) aborts it on the engine.
    """

    def __init__(
        self,
        client: EngineClient,
        metrics: FrontendMetrics,
        model: ServedModel,
        request: EngineCoreRequest,
        skip_special_tokens: bool,
        arrival: float,
    ) -> None:
        self._client = client
        self._metrics = metrics
        self._model = model
        self._request = request
        self._detokenizer = IncrementalDetokenizer(
            model.tokenizer, request.prompt_token_ids, skip_special_tokens
        )
        self._arrival = arrival  # time.monotonic() when the HTTP request came in
        self._stream: RequestStream | None = None
        self._finished = False
        self.num_output_tokens = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self._request.prompt_token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._request.prompt_token_ids

    async def __aenter__(self) -> Generation:
        self._stream = await self._client.add_request(self._request, self._model.name)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._stream is None or self._finished:
            return
        if not self._stream.done:  # still running on the engine
            await self._client.abort(self._request.request_id)
            self._metrics.observe_finish(self._model.name, self._stream.engine_index, "abort", None)

    async def deltas(self) -> AsyncIterator[CompletionDelta]:
        """The completion as it arrives; raises :class:`EngineRequestError` if the engine fails it."""
        assert self._stream is not None, "use Generation as `async with`"
        last_output_time: float | None = None
        async for output in self._stream:
            now = time.monotonic()
            if output.new_token_ids:
                self._observe_tokens(output, now, last_output_time)
                last_output_time = now
            finish = output.finish
            if finish is not None and finish.kind not in _NORMAL_FINISHES:
                raise EngineRequestError(finish.message or f"the engine ended the request ({finish.kind})")
            text = self._detokenizer.add(_text_token_ids(output))
            if finish is None:
                if text or output.new_token_ids:
                    yield CompletionDelta(text, output.new_token_ids, None, None)
                continue
            self._finished = True
            engine = self._stream.engine_index
            self._metrics.observe_finish(self._model.name, engine, finish.kind, now - self._arrival)
            stop_ids = self._request.sampling_params.stop_token_ids
            stop_reason = finish.stop_token_id if finish.stop_token_id in stop_ids else None
            text += self._detokenizer.finish()
            yield CompletionDelta(text, output.new_token_ids, finish.kind, stop_reason, output.spec_stats)
            return

    def _observe_tokens(self, output: EngineCoreOutput, now: float, last_output_time: float | None) -> None:
        assert self._stream is not None
        engine = self._stream.engine_index
        if last_output_time is None:
            ttft = now - self._arrival
            self._metrics.observe_first_token(self._model.name, engine, self.num_prompt_tokens, ttft)
        latency = None if last_output_time is None else now - last_output_time
        self._metrics.observe_output(self._model.name, engine, len(output.new_token_ids), latency)
        self.num_output_tokens += len(output.new_token_ids)


def _text_token_ids(output: EngineCoreOutput) -> list[int]:
    """The tokens whose text is shown: all but the stop token that ended the request (as vLLM does)."""
    finish = output.finish
    ids = output.new_token_ids
    if finish is not None and finish.kind == "stop" and ids and ids[-1] == finish.stop_token_id:
        return ids[:-1]
    return ids
