"""openinfer-serve's restarts: exponential backoff, a bounded number a minute, then it gives up; a dead
frontend ends everything at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from openinfer.engine_core.local_cluster import ProcessGroup
from openinfer.engine_core.supervisor import RestartHistory, RestartPolicy, Supervisor, describe_exit

EXITS = ["/bin/sh", "-c", "exit 3"]  # a child that dies at once
RUNS = ["/bin/sh", "-c", "sleep 30"]


def test_backoff_doubles_up_to_its_cap_and_the_limit_gives_up() -> None:
    """Defaults 1 s doubling, capped at 30 s, 5 restarts a minute: deaths at t=0..4 wait 1, 2, 4, 8, 16 s;
    a 6th death inside the minute gives up."""
    history = RestartHistory(RestartPolicy())
    assert [history.next_delay(t) for t in range(5)] == [1, 2, 4, 8, 16]
    assert history.next_delay(5) is None


def test_the_window_slides() -> None:
    """Deaths older than the window no longer count: the backoff starts over and the limit is not reached."""
    history = RestartHistory(RestartPolicy(max_restarts=2, window=60, backoff=0.5, max_backoff=1))
    assert [history.next_delay(0), history.next_delay(10)] == [0.5, 1]  # 1 s: capped
    assert history.next_delay(30) is None  # 2 restarts within the minute already
    assert history.next_delay(60.5) == 1  # the death at 0 has left the window; the one at 10 has not
    assert history.next_delay(200) == 0.5  # an empty window: the first wait again


def test_limit_zero_never_restarts() -> None:
    """--engine-restart-limit 0: the first death gives up (the launcher's behaviour before restarts)."""
    assert RestartHistory(RestartPolicy(max_restarts=0)).next_delay(0) is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [({"max_restarts": -1}, "--engine-restart-limit"), ({"backoff": 5, "max_backoff": 1}, "at most")],
)
def test_impossible_policies_are_refused(kwargs: dict[str, float], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]


def test_exit_descriptions() -> None:
    assert describe_exit(2) == "exited with code 2"
    assert describe_exit(-9) == "was killed by SIGKILL"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def wait_exited(group: ProcessGroup, name: str) -> None:
    process = group.processes[name]
    process.wait(10)


def test_a_dead_engine_is_started_again_after_its_backoff(tmp_path: Path) -> None:
    """Real child processes: an engine that exits is started again (same command, a new process) once
    its backoff has passed, not before; past the limit the supervisor gives up, naming it."""
    group, clock = ProcessGroup(tmp_path), Clock()
    supervisor = Supervisor(group, RestartPolicy(max_restarts=1, backoff=2, max_backoff=2), clock)
    try:
        supervisor.start("frontend", RUNS, None, restartable=False)
        supervisor.start("engine 0", EXITS, None, restartable=True)
        first = group.processes["engine 0"]
        wait_exited(group, "engine 0")
        assert supervisor.poll() is None  # scheduled for t=2
        clock.now = 1.9
        assert supervisor.poll() is None and group.processes["engine 0"] is first
        clock.now = 2.0
        assert supervisor.poll() is None
        assert group.processes["engine 0"] is not first and supervisor.restarts["engine 0"] == 1
        wait_exited(group, "engine 0")
        reason = supervisor.poll()
        assert reason == (
            "engine 0 exited with code 3, after 1 restart(s) in the last 60 s (--engine-restart-limit); "
            "giving up and stopping everything"
        )
    finally:
        group.stop()


def test_a_dead_frontend_stops_everything(tmp_path: Path) -> None:
    """The frontend is never restarted: its death is the reason to stop."""
    group = ProcessGroup(tmp_path)
    supervisor = Supervisor(group, RestartPolicy())
    try:
        supervisor.start("the frontend", EXITS, None, restartable=False)
        supervisor.start("engine 0", RUNS, None, restartable=True)
        wait_exited(group, "the frontend")
        deadline = time.monotonic() + 5
        while (reason := supervisor.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reason == "the frontend exited with code 3; stopping everything"
    finally:
        group.stop()


def test_an_engine_that_cannot_start_is_not_started_again(tmp_path: Path) -> None:
    """Exit status 2 (openinfer-engine's for flags or a model it cannot use): no restart, a reason at once."""
    group = ProcessGroup(tmp_path)
    supervisor = Supervisor(group, RestartPolicy())
    try:
        supervisor.start("the frontend", RUNS, None, restartable=False)
        supervisor.start("engine 0", ["/bin/sh", "-c", "exit 2"], None, restartable=True)
        wait_exited(group, "engine 0")
        assert supervisor.poll() == (
            "engine 0 exited with code 2: its flags or its model are wrong (its log says how); "
            "stopping everything"
        )
        assert supervisor.restarts["engine 0"] == 0
    finally:
        group.stop()
