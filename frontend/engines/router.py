"""Routing: the frontend's one map of in-flight requests, the bounds on it, and the choice of engine."""

from __future__ import annotations

from openinfer.frontend.engines.errors import EngineOverloadedError, NoEngineError
from openinfer.frontend.engines.registry import EngineRecord, EngineRegistry
from openinfer.frontend.engines.request_stream import RequestStream
from openinfer.protocol import EngineCoreOutput, EngineCoreRequest


class Router:
    """Every unfinished request of this frontend, by id, each in flight on one engine incarnation.

    A request is here from admission until its finishing output is routed, it is aborted, or it ends with
    an error; its :class:`RequestStream` says which engine holds it. Nothing else keeps a list of requests.

    Bounds: at most ``max_queued_total`` in all and ``max_queued_per_engine`` per engine; past them
    :meth:`admit` raises :class:`EngineOverloadedError` at once.
    """

    def __init__(self, registry: EngineRegistry, max_queued_per_engine: int, max_queued_total: int) -> None:
        if max_queued_per_engine < 1 or max_queued_total < 1:
            raise ValueError("the bounds on queued requests must be >= 1")
        self.registry = registry
        self.max_queued_per_engine = max_queued_per_engine
        self.max_queued_total = max_queued_total
        self._streams: dict[str, RequestStream] = {}

    def __len__(self) -> int:
        return len(self._streams)

    def on_engine(self, record: EngineRecord) -> dict[str, RequestStream]:
        """The requests in flight on this engine incarnation, by id."""
        return {
            request_id: stream
            for request_id, stream in self._streams.items()
            if stream.engine_index == record.index and stream.incarnation == record.incarnation
        }

    def on(self, record: EngineRecord, request_id: str) -> RequestStream | None:
        """The stream of ``request_id`` if it is in flight on this engine incarnation."""
        stream = self._streams.get(request_id)
        if stream is None or stream.engine_index != record.index or stream.incarnation != record.incarnation:
            return None
        return stream

    def admit(
        self, request: EngineCoreRequest, model_name: str, prefer: int | None = None
    ) -> tuple[EngineRecord, RequestStream]:
        """A new request, in flight on engine ``prefer`` if it is live, serves ``model_name`` and has room
        (a choice of a request whose prompt it cached), else on the least-loaded live engine serving it.

        Raises :class:`NoEngineError` if none serves it, :class:`EngineOverloadedError` past the bounds.
        """
        if request.request_id in self._streams:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        if len(self._streams) >= self.max_queued_total:
            raise EngineOverloadedError(
                f"the server holds {len(self._streams)} unfinished requests, its limit "
                "(--max-queued-total); retry later"
            )
        record = self.pick(model_name, prefer)
        if record is None:
            if not self.registry.serves(model_name):
                raise NoEngineError(f"no live engine serves model {model_name!r}")
            raise EngineOverloadedError(
                f"every engine serving {model_name!r} holds {self.max_queued_per_engine} unfinished "
                "requests, its limit (--max-queued-per-engine); retry later"
            )
        stream = RequestStream(request.request_id, record.index, model_name, request)
        self.assign(record, stream)
        return record, stream

    def pick(self, model_name: str, prefer: int | None = None) -> EngineRecord | None:
        """Engine ``prefer`` if it is live, serves ``model_name`` and is below the per-engine bound, else the
        least-loaded such engine, if any."""
        counts: dict[tuple[int, int | None], int] = {}
        for stream in self._streams.values():
            key = (stream.engine_index, stream.incarnation)
            counts[key] = counts.get(key, 0) + 1

        def has_room(record: EngineRecord) -> bool:
            return counts.get((record.index, record.incarnation), 0) < self.max_queued_per_engine

        preferred = self.registry.get(prefer) if prefer is not None else None
        if (
            preferred is not None
            and preferred.up
            and preferred.model_name == model_name
            and has_room(preferred)
        ):
            return preferred
        return self.registry.pick(model_name, has_room)

    def assign(self, record: EngineRecord, stream: RequestStream) -> None:
        """Put ``stream`` in flight on ``record`` (at once, so that the bounds see it)."""
        stream.engine_index, stream.incarnation = record.index, record.incarnation
        stream.num_sends += 1
        self._streams[stream.request_id] = stream
        record.sent_since_snapshot += 1

    def route(self, record: EngineRecord, output: EngineCoreOutput) -> bool:
        """Hand an output to its request's stream; False when the request is not in flight on ``record``."""
        stream = self.on(record, output.request_id)
        if stream is None:
            return output.finish is not None  # a finished one needs no abort
        if output.finish is not None:
            del self._streams[output.request_id]
        stream.put(output)
        return True

    def remove(self, request_id: str) -> RequestStream | None:
        """Take a request out of flight (it was aborted, or ends here); None if it is not in flight."""
        return self._streams.pop(request_id, None)

    def fail(self, stream: RequestStream, message: str) -> None:
        """End a request with an error: out of flight, its stream told why."""
        request_id = stream.request_id
        if self._streams.get(request_id) is stream:
            del self._streams[request_id]
        stream.fail(message)
