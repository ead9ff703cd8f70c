"""Structured-outputs constraints checked in worker processes, with a deadline, so that a slow one holds up
neither the event loop nor the threads that tokenize prompts."""

from __future__ import annotations

import importlib.util

import msgspec

from openinfer.frontend.openai.errors import invalid_request, overloaded
from openinfer.frontend.openai.grammar_check import CHECKED_KINDS
from openinfer.frontend.openai.structured_constraint import StructuredConstraint
from openinfer.frontend.openai.worker_pool import AnswerTimeout, WorkerFailed, WorkerPool, WorkersBusy

MAX_WORKERS = 2  # checks at once; more wait their turn, each for at most the pool's wait_timeout
_RETRY_AFTER_S = 1
_MAX_LINE_BYTES = 1 << 20  # a reply: null or a message of at most 2,000 characters
_ANSWER = msgspec.json.Decoder(str | None)


class GrammarCheckPool(WorkerPool):
    """Checks (:func:`~openinfer.frontend.openai.grammar_check.grammar_error`) in up to :data:`MAX_WORKERS`
    worker processes (a :class:`~openinfer.frontend.openai.worker_pool.WorkerPool`), each check within
    ``timeout`` seconds; a check that waits longer than ``wait_timeout`` seconds for a free worker is a 503
    (with Retry-After), so slow constraints queued ahead of it cannot make a request wait their deadlines one
    after another.

    A worker whose check is past its deadline, or whose client left (the handler is cancelled), is killed and
    another takes its place. Workers start on first use (about 2 s: xgrammar imports torch) and one is kept
    idle from then on. Without xgrammar there is nothing to check: the engine refuses what does not compile.
    """

    def __init__(self, timeout: float, wait_timeout: float) -> None:
        super().__init__(
            "openinfer.frontend.openai.grammar_check", timeout, wait_timeout, MAX_WORKERS, _MAX_LINE_BYTES
        )
        self._available: bool | None = None  # whether xgrammar is installed, looked up on first use

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
            error = _ANSWER.decode(await self.ask(msgspec.json.encode(constraint.outputs)))
        except WorkersBusy:
            raise overloaded(
                f"every one of the {MAX_WORKERS} workers that check structured-outputs constraints was busy for "
                f"{self._wait_timeout:g} s; retry later",
                _RETRY_AFTER_S,
            ) from None
        except AnswerTimeout:
            raise invalid_request(
                f"the {words} took more than {self._timeout:g} s to compile (the server's "
                "--grammar-check-timeout): make it simpler, with less nesting or fewer repetitions",
                param=constraint.param,
            ) from None
        except WorkerFailed:
            raise invalid_request(
                f"the {words} does not compile: xgrammar crashed on it", param=constraint.param
            ) from None
        if error is not None:
            raise invalid_request(error, param=constraint.param)
