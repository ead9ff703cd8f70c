"""One request running on an engine, seen as text deltas: detokenized, cut at stop strings, with logprobs."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import get_args

from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.engines.request_stream import RequestStream
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.openai.completion_delta import CompletionDelta, FinishKind
from openinfer.frontend.openai.sampling_options import SamplingOptions
from openinfer.frontend.openai.stop_strings import StopStringMatcher
from openinfer.frontend.tokenizer import IncrementalDetokenizer
from openinfer.protocol import EngineCoreOutput, EngineCoreRequest

logger = logging.getLogger(__name__)

# Finish kinds that end a request normally; any other ("error", "abort", unknown) is an engine error.
_NORMAL_FINISHES: dict[str, FinishKind] = {kind: kind for kind in get_args(FinishKind)}


class EngineRequestError(Exception):
    """The engine ended the request with an error, or died while running it; the message says which.

    ``bad_request``: the engine refused what the request asks (a grammar that does not compile), the
    client's error (HTTP 400) rather than the engine's (500)."""

    def __init__(self, message: str, bad_request: bool = False) -> None:
        super().__init__(message)
        self.bad_request = bad_request


class Generation:
    """One engine request from admission to its last delta: sends it, turns its outputs into
    :class:`CompletionDelta` s and observes its metrics (one choice of an HTTP request: see
    :class:`~openinfer.frontend.openai.choices.Choices`).

    Use as ``async with``: entering sends the request (``NoEngineError`` if no engine takes it); leaving
    before the last delta (the client went away, the handler was cancelled) aborts it on the engine. A stop
    string aborts it on the engine at once, so that no more tokens are computed for it.
    """

    def __init__(
        self,
        client: EngineClient,
        metrics: FrontendMetrics,
        model: ServedModel,
        request: EngineCoreRequest,
        options: SamplingOptions,
        arrival: float,
    ) -> None:
        self._client = client
        self._metrics = metrics
        self._model = model
        self._request = request
        self._detokenizer = IncrementalDetokenizer(
            model.tokenizer, request.prompt_token_ids, options.skip_special_tokens
        )
        self._stops = StopStringMatcher(options.stop, options.include_stop_str_in_output)
        self._arrival = arrival  # time.monotonic() when the HTTP request came in
        self._stream: RequestStream | None = None
        self.prefer_engine: int | None = None  # sent there when it can take it (n > 1: choice 0's engine)
        self._finished = False
        self.num_output_tokens = 0  # tokens of the completion: up to the one that completed a stop string
        self.num_cached_tokens = 0  # prompt tokens found in the answering engine's prefix cache

    @property
    def request_id(self) -> str:
        return self._request.request_id

    @property
    def engine_index(self) -> int | None:
        """The engine it was sent to; None before it was."""
        return None if self._stream is None else self._stream.engine_index

    @property
    def num_prompt_tokens(self) -> int:
        return len(self._request.prompt_token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._request.prompt_token_ids

    async def __aenter__(self) -> Generation:
        self._stream = await self._client.add_request(self._request, self._model.name, self.prefer_engine)
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
        answered = False
        async for output in self._stream:
            now = time.monotonic()
            if not answered:  # the engine that answers first is the one it stays on (nothing moves after)
                answered = True
                self.num_cached_tokens = self._cached_tokens(output)
            if output.new_token_ids:
                self._observe_tokens(output, now, last_output_time)
                last_output_time = now
            finish = output.finish
            if finish is not None and finish.kind not in _NORMAL_FINISHES:
                message = finish.message or f"the engine ended the request ({finish.kind})"
                raise EngineRequestError(message, bad_request=finish.kind == "error" and finish.bad_request)
            delta = self._delta(output)
            if delta.finish_reason is None:
                if delta.text or delta.token_ids:
                    yield delta
                continue
            self._finished = True
            if finish is None:  # a stop string ended it while the engine is still generating
                await self._client.abort(self._request.request_id)
            engine = self._stream.engine_index
            self._metrics.observe_finish(self._model.name, engine, delta.finish_reason, now - self._arrival)
            yield delta
            return

    def _delta(self, output: EngineCoreOutput) -> CompletionDelta:
        ids = output.new_token_ids
        num_shown = _num_text_tokens(output)
        text, num_kept = self._release(ids[:num_shown])
        if self._stops.match is None:
            num_kept = len(ids)  # a stop token that ended the request counts, as vLLM's usage does
        finish = output.finish
        if finish is not None and self._stops.match is None:
            text += self._stops.feed(self._detokenizer.finish())  # the tail may still complete a stop string
            if self._stops.match is None:
                text += self._stops.flush()
        self.num_output_tokens += num_kept
        logprobs = None if output.logprobs is None else output.logprobs[:num_kept]
        if self._stops.match is not None:
            return CompletionDelta(
                text, ids[:num_kept], logprobs, "stop", self._stops.match, output.spec_stats
            )
        if finish is None:
            return CompletionDelta(text, ids, logprobs, None, None)
        stop_ids = self._request.sampling_params.stop_token_ids
        stop_reason = finish.stop_token_id if finish.stop_token_id in stop_ids else None
        return CompletionDelta(
            text, ids, logprobs, _NORMAL_FINISHES[finish.kind], stop_reason, output.spec_stats
        )

    def _release(self, token_ids: list[int]) -> tuple[str, int]:
        """The text ``token_ids`` release, and how many of them are kept: all, or up to the one whose text
        completes a stop string (detokenized one by one then, to find it)."""
        if not self._stops.stops:
            return self._detokenizer.add(token_ids), len(token_ids)
        texts = []
        for i, token_id in enumerate(token_ids):
            texts.append(self._stops.feed(self._detokenizer.add([token_id])))
            if self._stops.match is not None:
                return "".join(texts), i + 1
        return "".join(texts), len(token_ids)

    def _cached_tokens(self, first: EngineCoreOutput) -> int:
        """The prompt tokens a request's first output says were cached; 0 (and a protocol error) when that
        cannot be true of this prompt."""
        if 0 <= first.num_cached_tokens <= self.num_prompt_tokens:
            return first.num_cached_tokens
        self._metrics.count_protocol_error("invalid")
        logger.warning(
            "request %s: the engine reports %d cached tokens of a %d-token prompt; reporting 0",
            self.request_id, first.num_cached_tokens, self.num_prompt_tokens,
        )  # fmt: skip
        return 0

    def _observe_tokens(self, output: EngineCoreOutput, now: float, last_output_time: float | None) -> None:
        assert self._stream is not None
        engine = self._stream.engine_index
        if last_output_time is None:
            ttft = now - self._arrival
            self._metrics.observe_first_token(self._model.name, engine, self.num_prompt_tokens, ttft)
        latency = None if last_output_time is None else now - last_output_time
        self._metrics.observe_output(self._model.name, engine, len(output.new_token_ids), latency)


def _num_text_tokens(output: EngineCoreOutput) -> int:
    """How many new tokens have text: all but the stop token that ended the request (as vLLM does)."""
    finish = output.finish
    ids = output.new_token_ids
    if finish is not None and finish.kind == "stop" and ids and ids[-1] == finish.stop_token_id:
        return len(ids) - 1
    return len(ids)
