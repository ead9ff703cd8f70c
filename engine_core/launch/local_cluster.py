"""A frontend and its engines as child processes on this machine: the one launcher behind `openinfer-serve`,
the end-to-end and deployment tests and the benchmarks. Children are started and stopped by pid, never by name.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from openinfer.engine_core.launch.http_listener import http_listener
from openinfer.protocol.addresses import engine_ports

HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1  # prctl(2)


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def free_port_pair(frontends: int = 1) -> int:
    """A port whose engine sockets' two ports (``protocol/addresses.py``) are both free on loopback; with
    several ``frontends``, the two ports of each (``openinfer-serve``: the next two for each next one)."""
    for _ in range(100):
        port = free_port()
        sockets: list[socket.socket] = []
        try:
            for frontend in range(frontends):
                for each in engine_ports(port + 2 * frontend):
                    sockets.append(socket.socket())
                    sockets[-1].bind((HOST, each))
            return port
        except OSError:
            continue
        finally:
            for each_socket in sockets:
                each_socket.close()
    raise RuntimeError("no free port pair on loopback")


def free_ports(num_http: int = 1, frontends: int = 1) -> tuple[list[int], int]:
    """``num_http`` free TCP ports and an engine port (``free_port_pair``'s, for ``frontends``), all distinct:
    the HTTP ports stay bound while the others are picked (a port just closed may be handed out again)."""
    sockets = [socket.socket() for _ in range(num_http)]
    try:
        for each in sockets:
            each.bind((HOST, 0))
        return [int(each.getsockname()[1]) for each in sockets], free_port_pair(frontends)
    finally:
        for each in sockets:
            each.close()


def python_module(module: str, *args: str) -> list[str]:
    """The argv that runs `module` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def _die_with_parent() -> None:
    """In a child before it execs (Linux): SIGTERM it when the thread that started it dies, so that a
    SIGKILLed launcher leaves no frontend or engine behind still holding its ports."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ProcessGroup:
    """Child processes by name. With a `log_dir` each writes to log_dir/NAME.log (unbuffered, one torch
    thread); without, they share this process's output and environment."""

    def __init__(self, log_dir: Path | None = None) -> None:
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        cpus: str | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> subprocess.Popen[bytes]:
        """Start `argv` as child `name`; `cpus` pins it with taskset where that exists; `pass_fds` are the
        file descriptors it inherits. OSError when its process cannot be made (fork or exec failed)."""
        if cpus is not None and shutil.which("taskset"):
            argv = ["taskset", "-c", cpus, *argv]
        if self.log_dir is None:
            child_env = None if env is None else dict(os.environ, **env)
            process = subprocess.Popen(argv, env=child_env, preexec_fn=_die_with_parent, pass_fds=pass_fds)
        else:
            log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
            child_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                preexec_fn=_die_with_parent,
                pass_fds=pass_fds,
            )
        self.processes[name] = process
        return process

    def exited(self) -> tuple[str, int] | None:
        """The first child that has exited, with its exit code; None while all run."""
        for name, process in self.processes.items():
            code = process.poll()
            if code is not None:
                return name, code
        return None

    def check_alive(self) -> None:
        """Raise RuntimeError, with the logs, if any child has exited."""
        dead = self.exited()
        if dead is not None:
            raise RuntimeError(f"{dead[0]} exited with {dead[1]}:\n{self.logs()}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to one child by pid; after SIGKILL, reap it (its name can be started again)."""
        process = self.processes[name]
        process.send_signal(sig)
        if sig == signal.SIGKILL:
            process.wait(10)

    def logs(self, chars: int = 3000) -> str:
        """The tail of every child's log."""
        if self.log_dir is None:
            return ""
        return "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-chars:]}"
            for f in sorted(self.log_dir.glob("*.log"))
        )

    def rss_bytes(self, name: str) -> int:
        """Resident memory of one child now (Linux)."""
        status = Path(f"/proc/{self.processes[name].pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024

    def cpu_seconds(self, name: str) -> float:
        """User + system CPU seconds one child has used (Linux)."""
        fields = Path(f"/proc/{self.processes[name].pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every child by pid (SIGCONT first: a stopped child cannot act on it), SIGKILL whichever is
        still running after `timeout` seconds."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def serve_children(pid: int) -> dict[str, int]:
    """The processes ``openinfer-serve`` (``pid``) runs now, by role: "frontend" (with several api servers,
    "api-server0", "api-server1"...), "engine0", "engine1"..., read from /proc (Linux): its restarted
    children have new pids."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    roles = {}
    for child in map(int, children.read_text().split() if children.exists() else []):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"openinfer.frontend.process.main" in argv:
            index = next((t.split(b"=")[1] for t in argv if t.startswith(b"--api-server-index=")), None)
            roles["frontend" if index is None else f"api-server{int(index)}"] = child
        elif b"--engine-index" in argv:
            roles[f"engine{int(argv[argv.index(b'--engine-index') + 1])}"] = child
    return roles


def answers_health(url: str, timeout: float = 0.5) -> bool:
    """True when ``url``/health answers at all (200, or 503 while no engine is up): the server got through its
    start and listens."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout):
            return True
    except urllib.error.HTTPError as e:
        e.close()
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(
    url: str,
    group: ProcessGroup,
    engines: int = 1,
    timeout: float = 60.0,
    abort: Callable[[], bool] = lambda: False,
    check: Callable[[], None] | None = None,
) -> bool:
    """Poll `url`/health until it answers 200 with at least `engines` engines up: True. False when `abort()`
    says to stop waiting; RuntimeError when `check()` raises it (by default: a child exited, with the logs);
    TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if abort():
            return False
        (check or group.check_alive)()
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200 and json.load(response).get("engines_up", 0) >= engines:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not healthy with {engines} engine(s) after {timeout:.0f} s:\n{group.logs()}")


class LocalCluster(ProcessGroup):
    """A frontend on free loopback ports and engines connecting to it, each logging under `log_dir`; with
    ``frontends`` > 1, that many frontends over the same engines, each engine connecting to all of them
    (:meth:`start_api_servers`: on one HTTP port; :meth:`start_frontend` with ``index``: each on its own)."""

    def __init__(self, log_dir: Path, frontends: int = 1, num_http_ports: int = 1) -> None:
        super().__init__(log_dir)
        self.frontends = frontends
        # ``http_ports[0]`` the frontend's (or the api servers'); more for frontends on ports of their own
        self.http_ports, self.engine_port = free_ports(num_http_ports, frontends)
        self.http_port = self.http_ports[0]
        self.url = f"http://{HOST}:{self.http_port}"
        self.engine_address = f"tcp://{HOST}:{self.engine_port}"
        self.listener: socket.socket | None = None  # the api servers' HTTP socket (start_api_servers)

    def frontend_address(self, index: int) -> str:
        """Frontend ``index``'s engine address."""
        return f"tcp://{HOST}:{self.engine_port + 2 * index}"

    def start_frontend(
        self,
        *extra: str,
        cpus: str | None = None,
        index: int = 0,
        http_port: int | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> subprocess.Popen[bytes]:
        """Frontend ``index`` (named "frontend", or "frontend<index>" when there are several) on
        ``http_port`` (default: the cluster's); ``pass_fds``: the file descriptors it inherits."""
        port = str(http_port or self.http_port)
        args = ["--host", HOST, "--port", port, "--engine-bind", self.frontend_address(index)]
        name = "frontend" if self.frontends == 1 else f"frontend{index}"
        argv = python_module("openinfer.frontend.process.main", *args, *extra)
        return self.spawn(name, argv, cpus=cpus, pass_fds=pass_fds)

    def start_api_servers(self, *extra: str, cpus: str | None = None) -> None:
        """Every frontend as api servers on the cluster's HTTP port, as ``openinfer-serve --api-server-count``
        runs them (the listening socket this cluster binds; their peers folder and states under the log
        folder)."""
        assert self.log_dir is not None
        peers = self.log_dir / "api-servers"
        peers.mkdir(mode=0o700, exist_ok=True)
        self.listener = self.listener or http_listener(HOST, self.http_port)
        fd = self.listener.fileno()
        count = str(self.frontends)
        for index in range(self.frontends):
            shared = [
                "--api-server-count",
                count,
                "--api-server-index",
                str(index),
                "--peers-dir",
                str(peers),
            ]
            shared += ["--state-dir", str(peers / "state"), f"--listen-fd={fd}"]
            self.start_frontend(*shared, *extra, cpus=cpus, index=index, pass_fds=(fd,))

    def start_engine(self, model: Path, index: int = 0, *extra: str) -> subprocess.Popen[bytes]:
        """A CPU engine serving `model` (`extra`: more engine flags)."""
        return self._engine(index, ["--model", str(model), *extra], None)

    def start_fake_engine(
        self, index: int = 0, *extra: str, cpus: str | None = None
    ) -> subprocess.Popen[bytes]:
        """A CPU engine with --fake-model (no weights: a 32-token cycle), served as "fake"."""
        return self._engine(index, ["--fake-model", "--served-model-name", "fake", *extra], cpus)

    def start_serve(self, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """`openinfer-serve` with its frontend on this cluster's ports (SIGTERM in `stop` ends its children);
        `env` is added to its environment."""
        args = ["--host", HOST, "--port", str(self.http_port), "--engine-port", str(self.engine_port), *extra]
        return self.spawn("serve", python_module("openinfer.engine_core.launch.serve", *args), env)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every child (:meth:`ProcessGroup.stop`), then close the api servers' socket."""
        super().stop(timeout)
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def wait_healthy(self, timeout: float = 60.0, engines: int = 1) -> None:
        """Until /health is 200 with at least `engines` engines up; raises with the logs otherwise."""
        wait_healthy(self.url, self, engines, timeout)

    def _engine(self, index: int, args: list[str], cpus: str | None) -> subprocess.Popen[bytes]:
        """Engine ``index``, connecting to every frontend; its first (its metrics frontend) is frontend
        ``index`` mod the count, as ``openinfer-serve`` does."""
        frontends = [self.frontend_address((index + i) % self.frontends) for i in range(self.frontends)]
        base = ["--device", "cpu", "--engine-index", str(index), "--frontend", *frontends]
        argv = python_module("openinfer.engine_core.process.engine_cli", *base, *args)
        return self.spawn(f"engine{index}", argv, cpus=cpus)
