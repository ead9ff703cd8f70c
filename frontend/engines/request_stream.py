"""The frontend's handle on one request running on an engine."""

from __future__ import annotations

import asyncio

from openinfer.protocol import EngineCoreOutput, EngineCoreRequest, FinishReason


class RequestStream:
    """The outputs of one request in arrival order; iteration ends after the output that carries ``finish``.

    The :class:`EngineClient` feeds it; ``done`` turns true once nothing more will come (a finishing output
    was queued, or the request was aborted). A consumer that stops early must call ``EngineClient.abort``.
    Until an output arrives (``started`` false) the client may move the request to another engine, which
    changes ``engine_index`` and ``incarnation``; ``request`` is what it re-sends.
    """

    def __init__(
        self, request_id: str, engine_index: int, model_name: str, request: EngineCoreRequest | None = None
    ) -> None:
        self.request_id = request_id
        self.engine_index = engine_index
        self.incarnation: int | None = None  # of the engine it is in flight on (None: not assigned yet)
        self.model_name = model_name
        self.request = request
        self.done = False
        self.started = False  # an output was queued: the client saw something, the request cannot move
        self.num_sends = 0  # engines it was sent to
        self._queue: asyncio.Queue[EngineCoreOutput] = asyncio.Queue()

    def put(self, output: EngineCoreOutput) -> None:
        """Queue one output; after a finishing output the stream is done and takes no more."""
        if self.done:
            return
        self._queue.put_nowait(output)
        self.started = True
        self.done = output.finish is not None

    def fail(self, message: str) -> None:
        """End the request with an error (its engine died, or the request could not be sent)."""
        self.put(EngineCoreOutput(self.request_id, [], FinishReason("error", message=message)))

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> EngineCoreOutput:
        if self.done and self._queue.empty():
            raise StopAsyncIteration
        return await self._queue.get()
