"""openinfer-serve's restarts: exponential backoff, a bounded number a minute, then it gives up; a child that
cannot start (exit status 2, or a frontend that dies before it was ready) ends everything at once."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from openinfer.engine_core.launch.local_cluster import ProcessGroup
from openinfer.engine_core.launch.supervisor import (
    Readiness,
    RestartHistory,
    RestartPolicy,
    Supervisor,
    describe_exit,
)
from openinfer.frontend.ready_pipe import ReadyPipe

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
        supervisor.start("frontend", RUNS, None)
        supervisor.start("engine 0", EXITS, None)
        first = group.processes["engine 0"]
        wait_exited(group, "engine 0")
        assert supervisor.poll() is None  # scheduled for t=2
        clock.now = 1.9
        assert supervisor.poll() is None and group.processes["engine 0"] is first
        clock.now = 2.0
        assert supervisor.poll() is None
        assert group.processes["engine 0"] is not first and supervisor.restarts("engine 0") == 1
        wait_exited(group, "engine 0")
        reason = supervisor.poll()
        assert reason == (
            "engine 0 exited with code 3, after 1 restart(s) in the last 60 s (--engine-restart-limit); "
            "giving up and stopping everything"
        )
    finally:
        group.stop()


class Health:
    """A readiness check the test turns on, as the frontend's /health starts answering."""

    def __init__(self) -> None:
        self.answers = False

    def readiness(self) -> Readiness:
        return Readiness("answering /health", lambda: self.answers)


def wait_for_reason(supervisor: Supervisor) -> str | None:
    """Poll until the supervisor gives a reason to stop (bounded: 5 s)."""
    deadline = time.monotonic() + 5
    while (reason := supervisor.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return reason


def wait_for_lines(path: Path, count: int) -> None:
    """Until ``path`` holds ``count`` lines (bounded: 5 s): the child got as far as writing its line."""
    deadline = time.monotonic() + 5
    while len(path.read_text().splitlines()) < count:
        assert time.monotonic() < deadline, path.read_text()
        time.sleep(0.01)


def test_a_frontend_that_dies_before_it_is_ready_stops_everything(tmp_path: Path) -> None:
    """A frontend that exits before its readiness check ever passed cannot start (a port taken, an
    unusable --state-dir): not started again, a reason at once, whatever its exit status."""
    group, health = ProcessGroup(tmp_path), Health()
    supervisor = Supervisor(group, RestartPolicy())
    try:
        supervisor.start("the frontend", ["/bin/sh", "-c", "exit 1"], None, health.readiness())
        supervisor.start("engine 0", RUNS, None)
        wait_exited(group, "the frontend")
        assert wait_for_reason(supervisor) == (
            "the frontend exited with code 1 before answering /health: it cannot start as configured (its "
            "log says why); stopping everything"
        )
        assert supervisor.restarts("the frontend") == 0
    finally:
        group.stop()


def test_a_ready_frontend_that_dies_is_started_again_and_the_engines_keep_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Real child processes: a frontend that was ready and is SIGKILLed is started again (same command and
    environment) after its backoff, while the engine's process is left alone; its readiness is logged with
    the time since its death was seen. If the restarted one dies before it is ready, everything stops."""
    group, clock, health = ProcessGroup(tmp_path), Clock(), Health()
    supervisor = Supervisor(group, RestartPolicy(backoff=0.5), clock)
    caplog.set_level("WARNING", "openinfer.serve")
    try:
        env = {"FRONTEND_MARK": "kept"}
        supervisor.start(
            "the frontend", ["/bin/sh", "-c", "echo $FRONTEND_MARK; exec sleep 30"], env, health.readiness()
        )
        supervisor.start("engine 0", RUNS, None)
        engine, first = group.processes["engine 0"], group.processes["the frontend"]
        health.answers = True
        assert supervisor.poll() is None and supervisor.states["the frontend"].ready
        log = tmp_path / "the frontend.log"
        wait_for_lines(log, 1)
        health.answers = False  # it is gone: /health answers no more
        group.kill("the frontend")
        assert supervisor.poll() is None  # scheduled for t=0.5
        clock.now = 0.4
        assert supervisor.poll() is None and group.processes["the frontend"] is first
        clock.now = 0.5
        assert supervisor.poll() is None
        assert group.processes["the frontend"] is not first and supervisor.restarts("the frontend") == 1
        clock.now = 2.0
        assert supervisor.poll() is None  # not ready yet: nothing logged
        health.answers = True
        clock.now = 2.5
        assert supervisor.poll() is None
        assert group.processes["engine 0"] is engine and engine.poll() is None
        assert [r.getMessage() for r in caplog.records] == [
            "the frontend was killed by SIGKILL; starting it again in 0.5 s",
            f"the frontend started again (pid {group.processes['the frontend'].pid}, restart 1)",
            "the frontend is answering /health again, 2.5 s after its death was seen",
        ]
        wait_for_lines(log, 2)
        health.answers = False
        group.kill("the frontend")  # ready again, so this death is restarted too (doubled backoff)
        assert supervisor.poll() is None and supervisor.states["the frontend"].due == 3.5
        clock.now = 3.5
        assert supervisor.poll() is None and supervisor.restarts("the frontend") == 2
        wait_for_lines(log, 3)
        group.kill("the frontend")  # before it was ready: it cannot start
        assert supervisor.poll() == (
            "the frontend was killed by SIGKILL before answering /health: it cannot start as configured "
            "(its log says why); stopping everything"
        )
        assert log.read_text() == "kept\n" * 3  # each start had the same environment
    finally:
        group.stop()


def test_an_engine_that_cannot_start_is_not_started_again(tmp_path: Path) -> None:
    """Exit status 2 (openinfer-engine's for flags or a model it cannot use): no restart, a reason at once."""
    group = ProcessGroup(tmp_path)
    supervisor = Supervisor(group, RestartPolicy())
    try:
        supervisor.start("the frontend", RUNS, None)
        supervisor.start("engine 0", ["/bin/sh", "-c", "exit 2"], None)
        wait_exited(group, "engine 0")
        assert supervisor.poll() == (
            "engine 0 exited with code 2: its flags or its model are wrong (its log says how); "
            "stopping everything"
        )
        assert supervisor.restarts("engine 0") == 0
    finally:
        group.stop()


# A frontend that listens and dies at once: it writes its ready line as the real one does, then exits 1.
READY_THEN_EXITS = [
    sys.executable,
    "-c",
    "from openinfer.frontend.ready_pipe import say_ready; say_ready(); exit(1)",
]


def test_a_frontend_ready_and_dead_between_two_polls_is_started_again(tmp_path: Path) -> None:
    """A frontend that said it was ready and died before any poll saw it alive: its readiness is read from
    its ready pipe when its death is seen, so it is started again, not judged unable to start; the start
    that follows is not ready until it says so itself."""
    group, clock = ProcessGroup(tmp_path), Clock()
    supervisor = Supervisor(group, RestartPolicy(backoff=0.5), clock)
    with ReadyPipe() as ready:
        listening = Readiness("listening", ready.said_ready)
        try:
            supervisor.start("the frontend", READY_THEN_EXITS, ready.env, listening, ready.pass_fds)
            wait_exited(group, "the frontend")  # ready and dead before the first poll
            assert supervisor.poll() is None and supervisor.states["the frontend"].due == 0.5
            clock.now = 0.5
            assert supervisor.poll() is None and supervisor.restarts("the frontend") == 1
            wait_exited(group, "the frontend")  # ready and dead again: started again (doubled backoff)
            assert supervisor.poll() is None and supervisor.states["the frontend"].due == 1.5
        finally:
            group.stop()


def test_a_frontend_that_never_said_ready_cannot_start(tmp_path: Path) -> None:
    """With a ready pipe, a frontend that exits without writing its line (a port taken) cannot start."""
    group = ProcessGroup(tmp_path)
    supervisor = Supervisor(group, RestartPolicy())
    with ReadyPipe() as ready:
        try:
            exits = [sys.executable, "-c", "exit(1)"]
            supervisor.start(
                "the frontend", exits, ready.env, Readiness("listening", ready.said_ready), ready.pass_fds
            )
            wait_exited(group, "the frontend")
            assert supervisor.poll() == (
                "the frontend exited with code 1 before listening: it cannot start as configured (its log says "
                "why); stopping everything"
            )
        finally:
            group.stop()


def test_a_child_whose_process_cannot_be_made_is_named(tmp_path: Path) -> None:
    """An executable that is not there: start() raises naming the child; a restart that cannot exec (its
    program removed after it started) is a reason to stop, naming it."""
    group, clock = ProcessGroup(tmp_path), Clock()
    supervisor = Supervisor(group, RestartPolicy(backoff=0.5), clock)
    program = tmp_path / "engine.sh"
    program.write_text("#!/bin/sh\nexit 3\n")
    program.chmod(0o700)
    try:
        with pytest.raises(RuntimeError, match=r"^engine 1 could not be started \(\[Errno 2\] No such file"):
            supervisor.start("engine 1", [str(tmp_path / "missing")], None)
        supervisor.start("engine 0", [str(program)], None)
        wait_exited(group, "engine 0")
        assert supervisor.poll() is None  # scheduled for t=0.5
        program.unlink()
        clock.now = 0.5
        reason = supervisor.poll()
        assert reason is not None and reason.startswith("engine 0 could not be started again ([Errno 2]")
        assert reason.endswith("); stopping everything")
    finally:
        group.stop()
