"""The sweep's servers: ``openinfer-serve`` started on free loopback ports with one drafter, stopped by pid."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

HOST = "127.0.0.1"
DEFAULT_K = 7
STOP_TIMEOUT_S = 30.0  # openinfer-serve SIGKILLs its children after 10 s of SIGTERM


@dataclass(frozen=True)
class Drafter:
    """A drafter as the sweep names it: ``none``, ``ngram[:K=7]`` or ``dflash[:PATH][:K=7]`` (no PATH: the
    server's own, the built-in drafter when it serves the built-in model)."""

    label: str  # as given on the command line
    method: str | None  # openinfer-serve --spec-method; None: no speculation
    num_spec_tokens: int | None
    draft_model: Path | None

    def serve_args(self) -> list[str]:
        if self.method is None:
            return ["--no-spec"]  # openinfer-serve drafts by default with the built-in model
        args = ["--spec-method", self.method, "--num-spec-tokens", str(self.num_spec_tokens)]
        return args + (["--draft-model", str(self.draft_model)] if self.draft_model else [])


def parse_drafter(text: str) -> Drafter:
    """``none``, ``ngram[:K=N]`` or ``dflash[:PATH][:K=N]`` (K defaults to 7); ``ValueError`` otherwise."""
    usage = f"drafter {text!r}: use none, ngram[:K=N] or dflash[:PATH][:K=N]"
    if text == "none":
        return Drafter(text, None, None, None)
    parts = text.split(":")
    k = DEFAULT_K
    if len(parts) > 1 and parts[-1].startswith("K="):
        value = parts.pop().removeprefix("K=")
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{usage} (K is a positive integer)")
        k = int(value)
    if parts == ["ngram"]:
        return Drafter(text, "ngram", k, None)
    if parts == ["dflash"]:
        return Drafter(text, "dflash", k, None)
    if len(parts) >= 2 and parts[0] == "dflash" and all(parts[1:]):
        return Drafter(text, "dflash", k, Path(":".join(parts[1:])))
    raise ValueError(usage)


def free_ports() -> tuple[int, int]:
    """An HTTP port and an engine port p with p + 1 also free (the frontend binds both), on loopback."""
    for _ in range(100):
        with socket.socket() as http, socket.socket() as engine:
            http.bind((HOST, 0))
            engine.bind((HOST, 0))
            http_port, engine_port = http.getsockname()[1], engine.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b, socket.socket() as c:
                a.bind((HOST, http_port))
                b.bind((HOST, engine_port))
                c.bind((HOST, engine_port + 1))
        except OSError:
            continue
        if http_port not in (engine_port, engine_port + 1):
            return http_port, engine_port
    raise RuntimeError("no free ports on loopback")


class LocalServer:
    """``openinfer-serve`` with one drafter, its engines' spec logs and its output under ``log_dir``.

    A context manager: entering starts it and waits for every engine; leaving stops it (SIGTERM to its pid,
    SIGKILL after ``STOP_TIMEOUT_S``).
    """

    def __init__(
        self,
        drafter: Drafter,
        log_dir: Path,
        model: Path | None,
        engines: int,
        device: str,
        extra_args: list[str],
        startup_timeout: float,
    ) -> None:
        self.drafter = drafter
        self.spec_log_dir = log_dir / "spec-logs"
        self.log_file = log_dir / "serve.log"
        self.engines = engines
        self.startup_timeout = startup_timeout
        http_port, engine_port = free_ports()
        self.url = f"http://{HOST}:{http_port}"
        self.command = [sys.executable, "-m", "openinfer.engine_core.serve", "--host", HOST]
        self.command += ["--port", str(http_port), "--engine-port", str(engine_port)]
        self.command += ["--engines", str(engines), "--device", device, "--log-level", "warning"]
        self.command += ["--spec-log-dir", str(self.spec_log_dir), *drafter.serve_args(), *extra_args]
        if model is not None:
            self.command += ["--model", str(model)]
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalServer:
        self.spec_log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        """Until /health says every engine is up; ``RuntimeError`` with the log's tail otherwise."""
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"openinfer-serve exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if json.load(response).get("engines_up", 0) >= self.engines:
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.3)
        raise RuntimeError(
            f"openinfer-serve not ready after {self.startup_timeout:.0f} s:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
