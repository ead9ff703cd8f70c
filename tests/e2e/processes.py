"""Start real frontend and engine processes on loopback for tests, and always stop them by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from openinfer.benchmarks.local_cluster import HOST, free_port, free_port_pair

__all__ = ["HOST", "Cluster", "free_port", "free_port_pair"]


class Cluster:
    """A frontend and its engines as child processes; logs go to files under ``log_dir``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.http_port = free_port()
        self.engine_port = free_port_pair()
        self.url = f"http://{HOST}:{self.http_port}"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        process = subprocess.Popen(
            [sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        self.processes[name] = process
        return process

    def start_frontend(self, *extra: str) -> subprocess.Popen[bytes]:
        return self._spawn(
            "frontend",
            [
                "openinfer.frontend.main",
                "--host",
                HOST,
                "--port",
                str(self.http_port),
                "--engine-bind",
                f"tcp://{HOST}:{self.engine_port}",
                *extra,
            ],
        )

    def start_engine(self, model: Path, index: int = 0, *extra: str) -> subprocess.Popen[bytes]:
        return self._spawn(
            f"engine{index}",
            [
                "openinfer.engine_core.engine_process",
                "--device",
                "cpu",
                "--model",
                str(model),
                "--served-model-name",
                "tiny",
                "--engine-index",
                str(index),
                "--frontend",
                f"tcp://{HOST}:{self.engine_port}",
                "--kv-cache-gb",
                "0.05",
                *extra,
            ],
        )

    def start_serve(self, model: Path, *extra: str) -> subprocess.Popen[bytes]:
        """``openinfer-serve`` with one CPU engine serving ``model`` as "tiny", its frontend on this cluster's
        ports (SIGTERM in :meth:`stop` ends its children too)."""
        return self._spawn(
            "serve",
            [
                "openinfer.engine_core.serve",
                "--model",
                str(model),
                "--served-model-name",
                "tiny",
                "--host",
                HOST,
                "--port",
                str(self.http_port),
                "--engine-port",
                str(self.engine_port),
                "--kv-cache-gb",
                "0.05",
                *extra,
            ],
        )

    def start_fake_engine(self, index: int = 0, *extra: str) -> subprocess.Popen[bytes]:
        """An engine with ``--fake-model`` (no weights: a 32-token cycle), served as "fake"."""
        return self._spawn(
            f"engine{index}",
            [
                "openinfer.engine_core.engine_process",
                "--device",
                "cpu",
                "--fake-model",
                "--served-model-name",
                "fake",
                "--engine-index",
                str(index),
                "--frontend",
                f"tcp://{HOST}:{self.engine_port}",
                "--num-kv-blocks",
                "2048",
                *extra,
            ],
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one child by pid; after SIGKILL, reap it (its name can be started again)."""
        process = self.processes[name]
        process.send_signal(sig)
        if sig == signal.SIGKILL:
            process.wait(10)

    def rss_bytes(self, name: str) -> int:
        """Resident memory of one child now (Linux)."""
        status = Path(f"/proc/{self.processes[name].pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024

    def wait_healthy(self, timeout: float = 60.0, engines: int = 1) -> None:
        """Until /health is 200 with at least ``engines`` engines up; raises with the logs otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.processes.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as r:
                    if r.status == 200 and json.load(r)["engines_up"] >= engines:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"not healthy after {timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}"
            for f in sorted(self.log_dir.glob("*.log"))
        )

    def stop(self) -> None:
        """SIGTERM each child by pid, SIGKILL after 10 s."""
        for p in self.processes.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)  # a stopped child cannot act on SIGTERM
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.processes.values():
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
