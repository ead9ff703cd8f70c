"""Worker processes that answer one line with one line, each answer within a deadline: how the frontend runs
what may take unbounded time or memory (a client's structured-outputs constraint, a model's chat template)
without holding up its event loop, or one of its threads for good.

The frontend's side is :class:`WorkerPool`; a worker's is :func:`serve_lines`, the ``main`` of the module the
pool runs as ``python -m``. A line is one JSON value (msgspec writes no raw newline).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable

logger = logging.getLogger(__name__)

READY = b"ready\n"  # a worker's first line, once it is warm
_PR_SET_PDEATHSIG = 1  # prctl(2)


class WorkersBusy(Exception):
    """Every worker stayed busy past the wait's deadline."""


class AnswerTimeout(Exception):
    """The answer took longer than the deadline: its worker was killed."""


class WorkerFailed(Exception):
    """The worker exited before answering (it crashed), or its answer was longer than the pool takes: it was
    killed."""


class WorkerPool:
    """Up to ``max_workers`` worker processes (``python -m module``), each answering one line at a time within
    ``timeout`` seconds; a line that waits longer than ``wait_timeout`` seconds for a free worker is refused
    (:class:`WorkersBusy`), so that slow lines queued ahead of it cannot make it wait their deadlines one
    after another.

    A worker's Python or C++ cannot be stopped from a thread, so a worker whose answer is past its deadline,
    whose asker left (cancelled), or that crashed is killed (SIGKILL, by its pid) and another takes its
    place. Workers start on first use, or at :meth:`start`, and one is kept idle from then on.
    """

    def __init__(
        self, module: str, timeout: float, wait_timeout: float, max_workers: int, max_line_bytes: int
    ) -> None:
        self._module = module
        self._name = module.rpartition(".")[2]  # in log lines and task names
        self._timeout = timeout
        self._wait_timeout = wait_timeout
        self._max_line_bytes = max_line_bytes
        self._turns = asyncio.Semaphore(max_workers)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._warming: asyncio.Task[None] | None = None  # starting the idle worker
        self._reaping: set[asyncio.Task[None]] = set()  # killed workers, until they are waited for
        self._closed = False

    @property
    def worker_pids(self) -> list[int]:
        """Every live worker's pid, idle or busy."""
        return sorted(worker.pid for worker in [*self._idle, *self._busy])

    @property
    def busy_pids(self) -> list[int]:
        """The pids of the workers answering a line now."""
        return sorted(worker.pid for worker in self._busy)

    def start(self) -> None:
        """Start the idle worker now (in the background), so that the first line need not wait for it."""
        self._keep_one_idle()

    async def ask(self, line: bytes) -> bytes:
        """A worker's answer to ``line`` (neither has the newline); :class:`WorkersBusy`,
        :class:`AnswerTimeout` or :class:`WorkerFailed` when there is none."""
        try:
            async with asyncio.timeout(self._wait_timeout):
                await self._turns.acquire()
        except TimeoutError:
            raise WorkersBusy from None
        try:
            return await self._ask_in_turn(line)
        finally:
            self._turns.release()

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

    async def _ask_in_turn(self, line: bytes) -> bytes:
        """The answer, from a worker of its own."""
        worker = await self._take()
        self._busy.add(worker)
        try:
            async with asyncio.timeout(self._timeout):
                answer = await worker.ask(line)
        except TimeoutError:
            logger.info("a %s answer took over %g s: worker %d killed", self._name, self._timeout, worker.pid)
            self._kill(worker)
            raise AnswerTimeout from None
        except WorkerFailed:
            logger.warning("a %s worker failed on its line: worker %d killed", self._name, worker.pid)
            self._kill(worker)
            raise
        except BaseException:  # cancelled: the asker left, and the answer is of no use
            self._kill(worker)
            raise
        finally:
            self._busy.discard(worker)
        self._idle.append(worker)
        return answer

    async def _take(self) -> _Worker:
        """An idle worker, or a new one; another starts in the background so that one stays idle."""
        if not self._idle and self._warming is not None:
            await asyncio.shield(self._warming)  # leaving this wait leaves the start under way
        for exited in [worker for worker in self._idle if not worker.running]:  # killed from outside
            self._idle.remove(exited)
            self._kill(exited)  # waited for; not the next asker's fault
        worker = self._idle.pop() if self._idle else await self._start_worker()
        self._keep_one_idle()
        return worker

    def _keep_one_idle(self) -> None:
        if not self._idle and self._warming is None and not self._closed:
            self._warming = asyncio.create_task(self._warm(), name=f"{self._name}-worker-start")

    async def _warm(self) -> None:
        try:
            self._idle.append(await self._start_worker())
        except Exception:  # noqa: BLE001 - a line that needs a worker starts one and reports the failure
            logger.exception("could not start a %s worker", self._name)
        finally:
            self._warming = None

    async def _start_worker(self) -> _Worker:
        """A new worker, once it says it is ready; RuntimeError when it exits first."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self._module,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=self._max_line_bytes,
        )
        worker = _Worker(process)
        try:
            line = await worker.readline()
        except BaseException:
            self._kill(worker)
            raise
        if line != READY:
            self._kill(worker)
            raise RuntimeError(f"a {self._name} worker exited as it started ({line!r}): see the log above")
        return worker

    def _kill(self, worker: _Worker) -> None:
        """SIGKILL ``worker`` (by its pid) and wait for it in the background; an idle one replaces it."""
        worker.kill()
        reap = asyncio.create_task(worker.wait(), name=f"{self._name}-worker-{worker.pid}-reap")
        self._reaping.add(reap)
        reap.add_done_callback(self._reaping.discard)
        self._keep_one_idle()


class _Worker:
    """One worker process: a line in on stdin, its answer out on stdout, one at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.pid = process.pid

    async def ask(self, line: bytes) -> bytes:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            stdin.write(line + b"\n")
            await stdin.drain()
            answer = await self.readline()
        except (ConnectionError, ValueError):  # it exited; or its answer is past the line limit
            raise WorkerFailed from None
        if not answer:
            raise WorkerFailed
        return answer.removesuffix(b"\n")

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


def serve_lines(
    answer: Callable[[bytes], bytes],
    warm: Callable[[], object],
    nice: int = 0,
    max_memory_bytes: int | None = None,
) -> None:
    """A worker's loop: ``answer`` each line of stdin (without its newline) on stdout until stdin closes; the
    pool kills a worker it no longer wants. Before it says it is ready the worker takes its limits (``nice``:
    behind the frontend for the CPU; ``max_memory_bytes``: its address space, past which an allocation is a
    MemoryError) and calls ``warm`` (imports, caches)."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")  # what libraries print goes to stderr
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    if sys.platform == "linux":  # die with the frontend, even mid-answer
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if nice:
        os.nice(nice)
    if max_memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (max_memory_bytes, max_memory_bytes))
    warm()
    replies.write(READY)
    replies.flush()
    for line in sys.stdin.buffer:
        replies.write(answer(line.removesuffix(b"\n")) + b"\n")
        replies.flush()
