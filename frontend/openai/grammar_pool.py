"""Structured-outputs constraints checked in worker processes, with a deadline, so that a slow one holds up
neither the event loop nor the threads that render chat templates and tokenize prompts."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys

import msgspec

from openinfer.frontend.openai.errors import invalid_request, overloaded
from openinfer.frontend.openai.grammar_check import CHECKED_KINDS, READY
from openinfer.frontend.openai.structured_options import StructuredConstraint
from openinfer.protocol import StructuredOutputs

logger = logging.getLogger(__name__)

MAX_WORKERS = 2  # checks at once; more wait their turn, each for at most the pool's wait_timeout
_RETRY_AFTER_S = 1
_MAX_LINE_BYTES = 1 << 20  # a reply: null or a message of at most 2,000 characters
_ANSWER = msgspec.json.Decoder(str | None)


class GrammarCheckPool:
    """Checks (:func:`~openinfer.frontend.openai.grammar_check.grammar_error`) in up to :data:`MAX_WORKERS`
    worker processes, each check within ``timeout`` seconds; a check that waits longer than ``wait_timeout``
    seconds for a free worker is a 503 (with Retry-After), so slow constraints queued ahead of it cannot make
    a request wait their deadlines one after another.

    xgrammar's C++ cannot be stopped from a thread, so a worker whose check is past its deadline, or whose
    client left (the handler is cancelled), is killed and another takes its place. Workers start on first use
    (about 2 s: xgrammar imports torch) and one is kept idle from then on. Without xgrammar there is nothing
    to check: the engine refuses what does not compile.
    """

    def __init__(self, timeout: float, wait_timeout: float) -> None:
        self._timeout = timeout
        self._wait_timeout = wait_timeout
        self._turns = asyncio.Semaphore(MAX_WORKERS)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._warming: asyncio.Task[None] | None = None  # starting the idle worker
        self._reaping: set[asyncio.Task[None]] = set()  # killed workers, until they are waited for
        self._closed = False
        self._available: bool | None = None  # whether xgrammar is installed, looked up on first use

    @property
    def worker_pids(self) -> list[int]:
        """Every live worker's pid, idle or busy."""
        return sorted(worker.pid for worker in [*self._idle, *self._busy])

    @property
    def busy_pids(self) -> list[int]:
        """The pids of the workers running a check now."""
        return sorted(worker.pid for worker in self._busy)

    async def check(self, constraint: StructuredConstraint) -> None:
        """400 naming the constraint's field when it does not compile, when it takes longer than the deadline,
        or when xgrammar crashes on it; 503 when every worker stays busy past the wait's deadline."""
        words = CHECKED_KINDS.get(constraint.outputs.kind)
        if words is None:
            return
        if self._available is None:
            self._available = importlib.util.find_spec("xgrammar") is not None
        if not self._available:
            return
        try:
            async with asyncio.timeout(self._wait_timeout):
                await self._turns.acquire()
        except TimeoutError:
            raise overloaded(
                f"every one of the {MAX_WORKERS} workers that check structured-outputs constraints was busy for "
                f"{self._wait_timeout:g} s; retry later",
                _RETRY_AFTER_S,
            ) from None
        try:
            error = await self._check_in_turn(constraint, words)
        finally:
            self._turns.release()
        if error is not None:
            raise invalid_request(error, param=constraint.param)

    async def _check_in_turn(self, constraint: StructuredConstraint, words: str) -> str | None:
        """The check, on a worker of its own: None when the constraint compiles, else xgrammar's words."""
        worker = await self._take()
        self._busy.add(worker)
        try:
            async with asyncio.timeout(self._timeout):
                error = await worker.check(constraint.outputs)
        except TimeoutError:
            logger.info("a %s took over %g s to compile: worker %d killed", words, self._timeout, worker.pid)
            self._kill(worker)
            raise invalid_request(
                f"the {words} took more than {self._timeout:g} s to compile (the server's "
                "--grammar-check-timeout): make it simpler, with less nesting or fewer repetitions",
                param=constraint.param,
            ) from None
        except _WorkerExited:
            logger.warning("xgrammar crashed on a %s: worker %d exited", words, worker.pid)
            self._kill(worker)
            raise invalid_request(
                f"the {words} does not compile: xgrammar crashed on it", param=constraint.param
            ) from None
        except BaseException:  # cancelled: the client left, and the check is of no use
            self._kill(worker)
            raise
        finally:
            self._busy.discard(worker)
        self._idle.append(worker)
        return error

    async def close(self) -> None:
        """Kill every worker and wait for them."""
        self._closed = True
        if self._warming is not None:
            self._warming.cancel()
            await asyncio.gather(self._warming, return_exceptions=True)
        for worker in [*self._idle, *self._busy]:
            self._kill(worker)
        self._idle.clear()
        await asyncio.gather(*self._reaping, return_exceptions=True)

    async def _take(self) -> _Worker:
        """An idle worker, or a new one; another starts in the background so that one stays idle."""
        if not self._idle and self._warming is not None:
            await asyncio.shield(self._warming)  # leaving this wait leaves the start under way
        for exited in [worker for worker in self._idle if not worker.running]:  # killed from outside
            self._idle.remove(exited)
            self._kill(exited)  # waited for; not the next client's fault
        worker = self._idle.pop() if self._idle else await self._start_worker()
        self._keep_one_idle()
        return worker

    def _keep_one_idle(self) -> None:
        if not self._idle and self._warming is None and not self._closed:
            self._warming = asyncio.create_task(self._warm(), name="grammar-worker-start")

    async def _warm(self) -> None:
        try:
            self._idle.append(await self._start_worker())
        except Exception:  # noqa: BLE001 - a check that needs a worker starts one and reports the failure
            logger.exception("could not start a grammar check worker")
        finally:
            self._warming = None

    async def _start_worker(self) -> _Worker:
        """A new worker, once it has imported xgrammar; RuntimeError when it exits first."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "openinfer.frontend.openai.grammar_check",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_MAX_LINE_BYTES,
        )
        worker = _Worker(process)
        try:
            line = await worker.readline()
        except BaseException:
            self._kill(worker)
            raise
        if line != READY:
            self._kill(worker)
            raise RuntimeError(f"a grammar check worker exited as it started ({line!r}): see the log above")
        return worker

    def _kill(self, worker: _Worker) -> None:
        """SIGKILL ``worker`` (by its pid) and wait for it in the background; an idle one replaces it."""
        worker.kill()
        reap = asyncio.create_task(worker.wait(), name=f"grammar-worker-{worker.pid}-reap")
        self._reaping.add(reap)
        reap.add_done_callback(self._reaping.discard)
        self._keep_one_idle()


class _WorkerExited(Exception):
    """A worker closed its stdout mid-check: it crashed."""


class _Worker:
    """One worker process: a constraint in on stdin, its answer out on stdout, one at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.pid = process.pid

    async def check(self, outputs: StructuredOutputs) -> str | None:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            stdin.write(msgspec.json.encode(outputs) + b"\n")
            await stdin.drain()
        except ConnectionError:
            raise _WorkerExited from None
        line = await self.readline()
        if not line:
            raise _WorkerExited
        return _ANSWER.decode(line)

    async def readline(self) -> bytes:
        stdout = self._process.stdout
        assert stdout is not None
        return await stdout.readline()

    @property
    def running(self) -> bool:
        return self._process.returncode is None

    def kill(self) -> None:
        if self._process.returncode is None:
            self._process.kill()

    async def wait(self) -> None:
        await self._process.wait()
