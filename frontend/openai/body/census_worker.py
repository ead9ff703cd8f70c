"""Censuses of large request bodies (:mod:`~openinfer.frontend.openai.body.census`) taken in a worker process,
so that the event loop only copies such a body into a pipe."""

from __future__ import annotations

import asyncio
import logging
import sys

import msgspec

from openinfer.frontend.openai.body.census import INLINE_BYTES, LENGTH_BYTES, BodyCensus, take_census
from openinfer.frontend.openai.errors import ApiError, overloaded, retry_later

logger = logging.getLogger(__name__)

# A census takes about 0.4 s for the largest body a Qwen3 model takes (36 MB of empty strings), so one past
# this is a machine too loaded to serve, or a bug: its worker is killed and its request answered 503.
CENSUS_TIMEOUT_S = 10.0
# Censuses waiting for the worker, each holding its body (up to tens of MB); past it, 503 with Retry-After.
MAX_WAITING = 16
_RETRY_AFTER_S = 1


class CensusWorker:
    """Takes the census of each body larger than :data:`INLINE_BYTES` in one worker process, started on first
    need and kept; censuses wait their turn, at most ``max_waiting`` of them, and each runs within
    ``timeout`` seconds or its worker is killed (another starts for the next).

    A client that leaves while its census waits for its turn leaves the queue (and frees its body) at once;
    one whose census is under way does not stop it: an exchange cut short would leave its answer in the pipe
    for the next census to read, so the exchange keeps the turn until it ends.
    """

    def __init__(self, timeout: float = CENSUS_TIMEOUT_S, max_waiting: int = MAX_WAITING) -> None:
        self._timeout = timeout
        self._max_waiting = max_waiting
        self._worker: asyncio.subprocess.Process | None = None
        self._turn = asyncio.Lock()
        self._waiting = 0  # censuses waiting for the turn
        self._closed = False
        self._decoder = msgspec.json.Decoder(BodyCensus)

    @property
    def pid(self) -> int | None:
        """The worker's pid while it runs (for tests and operators)."""
        worker = self._worker
        return worker.pid if worker is not None and worker.returncode is None else None

    @property
    def waiting(self) -> int:
        """How many censuses wait for their turn (the one under way not counted)."""
        return self._waiting

    async def take(self, body: bytes) -> BodyCensus:
        """The census of ``body``: here when it is small, else in the worker; 503 with Retry-After when
        ``max_waiting`` censuses wait already, when the census takes longer than the deadline or the worker
        dies, or when the server is closing."""
        if len(body) <= INLINE_BYTES:
            return take_census(body)
        if self._waiting >= self._max_waiting:
            raise overloaded(
                f"{self._waiting} large request bodies are waiting to be checked before decoding; retry later",
                _RETRY_AFTER_S,
            )
        self._waiting += 1
        try:
            await self._turn.acquire()  # a client that leaves here lets go of its body
        finally:
            self._waiting -= 1
        exchange = asyncio.create_task(self._exchange(body), name="body-census")
        exchange.add_done_callback(self._end_turn)
        return await asyncio.shield(exchange)

    async def close(self) -> None:
        """Kill the worker (by its pid; a census under way is a 503) and wait for it; later ones are 503s."""
        self._closed = True
        worker, self._worker = self._worker, None
        if worker is not None:
            if worker.returncode is None:
                worker.kill()
            await worker.wait()

    def _end_turn(self, exchange: asyncio.Task[BodyCensus]) -> None:
        self._turn.release()
        if not exchange.cancelled():
            exchange.exception()  # retrieved: its client may have left, and no one else will

    async def _exchange(self, body: bytes) -> BodyCensus:
        """Send ``body`` to the worker (starting one if none runs) and read its census, within the deadline."""
        if self._closed:
            raise _unavailable("the server is shutting down; retry on another")
        worker = self._worker
        if worker is None or worker.returncode is not None:
            worker = self._worker = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "openinfer.frontend.openai.body.census",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
        assert worker.stdin is not None and worker.stdout is not None
        try:
            async with asyncio.timeout(self._timeout):
                worker.stdin.write(len(body).to_bytes(LENGTH_BYTES, "big"))
                worker.stdin.write(body)
                await worker.stdin.drain()
                line = await worker.stdout.readline()
        except TimeoutError:
            logger.warning(
                "the census of a %d-byte body took over %g s: body census worker %d killed",
                len(body),
                self._timeout,
                worker.pid,
            )
            await self._stop(worker)
            raise overloaded(
                f"checking the {len(body)}-byte request body before decoding it took more than "
                f"{self._timeout:g} s: the server is overloaded; retry later",
                _RETRY_AFTER_S,
            ) from None
        except ConnectionError:  # the worker is gone: killed by close(), or crashed
            line = b""
        if not line:
            await self._stop(worker)
            if self._closed:
                raise _unavailable("the server is shutting down; retry on another")
            logger.error("the body census worker (pid %d) exited: %s", worker.pid, worker.returncode)
            raise _unavailable(
                f"the worker that checks large request bodies exited (status {worker.returncode}); retry"
            )
        return self._decoder.decode(line)

    async def _stop(self, worker: asyncio.subprocess.Process) -> None:
        """SIGKILL ``worker`` if it runs and wait for it; the next census starts another."""
        if self._worker is worker:
            self._worker = None
        if worker.returncode is None:
            worker.kill()
        await worker.wait()


def _unavailable(message: str) -> ApiError:
    return retry_later(message, _RETRY_AFTER_S, "body_census_failed")
