"""``openinfer-serve``'s watch over its children: an engine that dies is started again with the same index and
flags, after a backoff, a bounded number of times a minute; a frontend that dies, or an engine that keeps
dying, ends everything.

The frontend takes a restarted engine back by itself (a hello with a new incarnation, once the old one's
connection is closed or silent); only the requests the dead engine held end with an error.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from openinfer.engine_core.local_cluster import ProcessGroup

logger = logging.getLogger("openinfer.serve")

CONFIG_ERROR = (
    2  # openinfer-engine's exit status for flags or a model it cannot use: starting it again cannot help
)


@dataclass(frozen=True)
class RestartPolicy:
    """When a dead engine is started again (``--engine-restart-*``)."""

    max_restarts: int = 5  # restarts of one engine within `window`; one more death and the launcher gives up
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
    """One engine's restarts within the policy's sliding window."""

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
class Child:
    """How to start one child again."""

    argv: list[str]
    env: dict[str, str] | None
    restartable: bool  # an engine; the frontend is not (its death ends everything)


class Supervisor:
    """Starts the children and, polled, restarts dead engines; :meth:`poll` says why to stop everything."""

    def __init__(
        self, group: ProcessGroup, policy: RestartPolicy, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.group = group
        self.policy = policy
        self.clock = clock
        self.children: dict[str, Child] = {}
        self.histories: dict[str, RestartHistory] = {}
        self.due: dict[str, float] = {}  # name -> when a dead engine is started again
        self.restarts: dict[str, int] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None, restartable: bool) -> None:
        self.children[name] = Child(argv, env, restartable)
        self.histories[name] = RestartHistory(self.policy)
        self.restarts[name] = 0
        self.group.spawn(name, argv, env)

    def poll(self) -> str | None:
        """Restart what is due, schedule a restart for each engine that died; the reason to stop everything
        (the frontend died, or an engine died too often), else None."""
        now = self.clock()
        for name, child in self.children.items():
            if name in self.due:
                if now >= self.due[name]:
                    del self.due[name]
                    self.restarts[name] += 1
                    pid = self.group.spawn(name, child.argv, child.env).pid
                    logger.warning("%s started again (pid %d, restart %d)", name, pid, self.restarts[name])
                continue
            code = self.group.processes[name].poll()
            if code is None:
                continue
            if not child.restartable:
                return f"{name} {describe_exit(code)}; stopping everything"
            if code == CONFIG_ERROR:
                wrong = "its flags or its model are wrong (its log says how)"
                return f"{name} {describe_exit(code)}: {wrong}; stopping everything"
            delay = self.histories[name].next_delay(now)
            if delay is None:
                return (
                    f"{name} {describe_exit(code)}, after {self.policy.max_restarts} restart(s) in the last "
                    f"{self.policy.window:g} s (--engine-restart-limit); giving up and stopping everything"
                )
            logger.warning("%s %s; starting it again in %.1f s", name, describe_exit(code), delay)
            self.due[name] = now + delay
        return None


def describe_exit(code: int) -> str:
    """``exited with code 2``, ``was killed by SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
