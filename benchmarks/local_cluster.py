"""A frontend and --fake-model engines as local processes for the frontend benchmarks; stopped by pid.

Each process can be pinned to CPU cores (``taskset``), so that the frontend's own capacity is measured on
a core of its own.
"""

from __future__ import annotations

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
from pathlib import Path

HOST = "127.0.0.1"


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def free_port_pair() -> int:
    """A port p with p and p + 1 both free on loopback (the frontend's engine sockets use two)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind((HOST, port))
                b.bind((HOST, port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair on loopback")


class LocalCluster:
    """Processes by name; logs in ``log_dir``; ``cpus`` pins a process with taskset when available."""

    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.http_port = free_port()
        self.engine_port = free_port_pair()
        self.url = f"http://{HOST}:{self.http_port}"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, module: str, args: list[str], cpus: str | None = None) -> None:
        command = [sys.executable, "-m", module, *args]
        if cpus is not None and shutil.which("taskset"):
            command = ["taskset", "-c", cpus, *command]
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        self.processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def start_frontend(self, *extra: str, cpus: str | None = None) -> None:
        args = [
            "--host",
            HOST,
            "--port",
            str(self.http_port),
            "--engine-bind",
            f"tcp://{HOST}:{self.engine_port}",
        ]
        self.spawn("frontend", "openinfer.frontend.main", [*args, "--log-level", "warning", *extra], cpus)

    def start_fake_engine(self, index: int, *extra: str, cpus: str | None = None) -> None:
        args = [
            "--device",
            "cpu",
            "--fake-model",
            "--served-model-name",
            "fake",
            "--engine-index",
            str(index),
        ]
        args += [
            "--frontend",
            f"tcp://{HOST}:{self.engine_port}",
            "--num-kv-blocks",
            "8192",
            "--max-num-seqs",
            "256",
        ]
        self.spawn(
            f"engine{index}",
            "openinfer.engine_core.engine_process",
            [*args, "--log-level", "warning", *extra],
            cpus,
        )

    def kill(self, name: str) -> None:
        process = self.processes[name]
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def wait_engines(self, engines: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/admin/engines", timeout=1) as r:
                    if sum(e["up"] for e in json.load(r)["engines"]) >= engines:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{engines} engines not up after {timeout} s; logs in {self.log_dir}")

    def cpu_seconds(self, name: str) -> float:
        """User + system CPU seconds the process has used (Linux /proc)."""
        fields = Path(f"/proc/{self.processes[name].pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
