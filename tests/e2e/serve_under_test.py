"""``openinfer-serve`` as the e2e tests run it (the fake model), and the process states they wait for."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.e2e.processes import Cluster, kill_all, serve_children


class Serve:
    """``openinfer-serve`` under test; every child pid it was seen with is killed at the end if alive."""

    def __init__(
        self, log_dir: Path, *flags: str, env: dict[str, str] | None = None, api_servers: int = 1
    ) -> None:
        self.cluster = Cluster(log_dir, api_servers)
        self.process = self.cluster.start_serve_fake(*flags, env=env)
        self.seen: set[int] = set()

    def children(self) -> dict[str, int]:
        roles = serve_children(self.process.pid)
        self.seen |= set(roles.values())
        return roles

    def wait_for(self, role: str, other_than: int | None = None, timeout: float = 90.0) -> int:
        """The pid of ``role`` once it runs (and is not ``other_than``)."""
        deadline = time.monotonic() + timeout
        while (pid := self.children().get(role)) is None or pid == other_than:
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, f"no {role} after {timeout} s:\n{self.log()}"
            time.sleep(0.05)
        return pid

    def wait_serving(self, timeout: float = 90.0) -> None:
        """Until serve announced that it serves (once /health said every engine is up)."""
        deadline = time.monotonic() + timeout
        while "openinfer is serving" not in self.log():
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, f"serve did not announce itself in {timeout} s:\n{self.log()}"
            time.sleep(0.05)

    def log(self) -> str:
        return (self.cluster.log_dir / "serve.log").read_text(errors="replace")  # type: ignore[operator]

    def close(self) -> None:
        self.cluster.stop(30)
        kill_all(self.seen)


def gone(pid: int) -> bool:
    """Process ``pid`` has exited (reaped, or a zombie)."""
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "zombie" in status.read_text()


def wait_for_state(pid: int, state: str) -> None:
    """Until process ``pid`` is in ``state`` (``T``: stopped; ``Z``: dead, every thread of it gone, so its
    sockets are closed: its first thread is a zombie while the others may still be exiting). Bounded: 10 s."""
    deadline = time.monotonic() + 10
    while True:
        now = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if now == state and (state != "Z" or os.listdir(f"/proc/{pid}/task") == [str(pid)]):
            return
        assert time.monotonic() < deadline, f"process {pid} is in state {now}, not {state}"
        time.sleep(0.01)
