"""``openinfer-serve``'s watch over its children: a child that dies is started again with the same command
and environment, after a backoff, a bounded number of times a minute; one that keeps dying, or that cannot
start at all, ends everything.

An engine restarted this way is taken back by the frontend by itself (a hello with a new incarnation, once
the old one's connection is closed or silent); only the requests the dead engine held end with an error. A
restarted frontend binds the same ports, and the engines, which kept running, reconnect to it by themselves;
with ``--state-dir`` it continues every counter series from the baselines it saved (docs/design.md, frontend
diffing). Its requests in flight ended with it (their clients lost the connection); the engines' outputs for
them reach the new frontend, which aborts them there.

A child cannot start when it exits with status 2 (``openinfer-engine``'s, and argparse's, for flags or a model
it cannot use), when its process cannot be made (fork or exec fails), or, for a child with a
:class:`Readiness` (the frontend), when it dies before it got ready after its start or restart (a port taken,
an unusable ``--state-dir`` or keys: it exits 1 then, as it also does on a crash later, so the status alone
cannot tell). Starting it again could not help, so it is not. Whether a dead child had got ready is read
once more when its death is seen, from what it left behind (its ready pipe,
:class:`~openinfer.frontend.ready_pipe.ReadyPipe`): one ready and dead between two polls is started again.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from openinfer.engine_core.launch.local_cluster import ProcessGroup

logger = logging.getLogger("openinfer.serve")

CONFIG_ERROR = 2  # openinfer-engine's (and argparse's) exit status for flags or a model it cannot use


@dataclass(frozen=True)
class RestartPolicy:
    """When a dead child (an engine, or the frontend) is started again (``--engine-restart-*``)."""

    max_restarts: int = 5  # restarts of one child within `window`; one more death and the launcher gives up
    window: float = 60.0  # seconds: the sliding window `max_restarts` counts in
    backoff: float = 1.0  # seconds before a restart with none in the window; doubled for each one there
    max_backoff: float = 30.0  # the longest wait before a restart

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"--engine-restart-limit must be >= 0, got {self.max_restarts}")
        if not (0 <= self.backoff <= self.max_backoff):
            raise ValueError(
                f"--engine-restart-backoff ({self.backoff}) must be >= 0 and at most "
                f"--engine-restart-backoff-max ({self.max_backoff})"
            )
        if not self.window > 0:
            raise ValueError(f"the restart window must be positive, got {self.window}")


@dataclass
class RestartHistory:
    """One child's restarts within the policy's sliding window."""

    policy: RestartPolicy
    deaths: deque[float] = field(default_factory=deque)  # monotonic times of the deaths restarted from

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before restarting after a death at ``now``, which is counted; None: the window
        already holds ``max_restarts`` restarts, give up."""
        while self.deaths and self.deaths[0] <= now - self.policy.window:
            self.deaths.popleft()
        recent = len(self.deaths)
        if recent >= self.policy.max_restarts:
            return None
        self.deaths.append(now)
        return min(self.policy.backoff * 2**recent, self.policy.max_backoff)


@dataclass(frozen=True)
class Readiness:
    """How to tell that a child got through its start (the frontend: it said so on its ready pipe)."""

    what: str  # what ready means, for the log: "listening on http://127.0.0.1:8000"
    # True once ready; called at each poll until then and once more when its death is seen, so it must be
    # quick and, to be exact, answer from what the child wrote (a pipe), which outlives it.
    check: Callable[[], bool]


@dataclass(frozen=True)
class Child:
    """How to start one child again."""

    argv: list[str]
    env: dict[str, str] | None  # added to this process's environment
    readiness: Readiness | None  # None: only its exit status tells that it cannot start
    pass_fds: tuple[int, ...]  # file descriptors it inherits (its ready pipe's write end)


@dataclass
class ChildState:
    """What the supervisor knows of one child between polls."""

    history: RestartHistory
    restarts: int = 0
    due: float | None = None  # when a dead child is started again
    died: float | None = None  # when its last death was seen (logged once it is ready again)
    ready: bool = False  # its readiness check said so since it was last started


class Supervisor:
    """Starts the children and, polled, restarts dead ones; :meth:`poll` says why to stop everything."""

    def __init__(
        self, group: ProcessGroup, policy: RestartPolicy, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.group = group
        self.policy = policy
        self.clock = clock
        self.children: dict[str, Child] = {}
        self.states: dict[str, ChildState] = {}

    def start(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None,
        readiness: Readiness | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        """Start child ``name``; RuntimeError, saying why, when its process cannot be made."""
        child = Child(argv, env, readiness, pass_fds)
        try:
            pid = self.group.spawn(name, argv, env, pass_fds=pass_fds).pid
        except OSError as e:
            raise RuntimeError(f"{name} could not be started ({e}); stopping everything") from e
        logger.info("%s started (pid %d)", name, pid)
        self.children[name] = child
        self.states[name] = ChildState(RestartHistory(self.policy))

    def restarts(self, name: str) -> int:
        """How many times ``name`` was started again."""
        return self.states[name].restarts

    def poll(self) -> str | None:
        """Restart what is due, schedule a restart for each child that died, note children that became
        ready; the reason to stop everything (a child cannot start, or died too often), else None."""
        now = self.clock()
        for name, child in self.children.items():
            state = self.states[name]
            if state.due is not None:
                if now >= state.due:
                    state.due, state.ready = None, False
                    state.restarts += 1
                    try:
                        pid = self.group.spawn(name, child.argv, child.env, pass_fds=child.pass_fds).pid
                    except OSError as e:
                        return f"{name} could not be started again ({e}); stopping everything"
                    logger.warning("%s started again (pid %d, restart %d)", name, pid, state.restarts)
                continue
            code = self.group.processes[name].poll()
            if code is None:
                self._check_ready(name, child, state, now)
                continue
            reason = self._on_death(name, child, state, code, now)
            if reason is not None:
                return reason
        return None

    def _check_ready(self, name: str, child: Child, state: ChildState, now: float) -> None:
        if child.readiness is None or state.ready or not child.readiness.check():
            return
        state.ready = True
        if state.died is not None:
            logger.warning(
                "%s is %s again, %.1f s after its death was seen",
                name,
                child.readiness.what,
                now - state.died,
            )
            state.died = None

    def _on_death(self, name: str, child: Child, state: ChildState, code: int, now: float) -> str | None:
        """Schedule the restart of a child that exited with ``code``, or say why everything must stop."""
        died = describe_exit(code)
        self._check_ready(name, child, state, now)  # it may have got ready since the last poll, then died
        if child.readiness is not None and not state.ready:
            return (
                f"{name} {died} before {child.readiness.what}: it cannot start as configured (its log says "
                "why); stopping everything"
            )
        if code == CONFIG_ERROR:
            return f"{name} {died}: its flags or its model are wrong (its log says how); stopping everything"
        delay = state.history.next_delay(now)
        if delay is None:
            return (
                f"{name} {died}, after {self.policy.max_restarts} restart(s) in the last "
                f"{self.policy.window:g} s (--engine-restart-limit); giving up and stopping everything"
            )
        logger.warning("%s %s; starting it again in %.1f s", name, died, delay)
        state.due, state.died = now + delay, now
        return None


def describe_exit(code: int) -> str:
    """``exited with code 2``, ``was killed by SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
