"""Real frontend and engine processes on loopback for tests (openinfer.engine_core.launch.local_cluster, with the
tests' defaults), always stopped by pid."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path

from openinfer.engine_core.launch.local_cluster import (
    HOST,
    LocalCluster,
    free_port,
    free_port_pair,
    free_ports,
    serve_children,
)

__all__ = [
    "ADMIN_HEADERS",
    "ADMIN_KEY",
    "HOST",
    "Cluster",
    "cmdline",
    "free_port",
    "free_port_pair",
    "free_ports",
    "serve_children",
]

# The admin routes are off without a key: tests that use them start the frontend with --admin-api-key.
ADMIN_KEY = "e2e-admin-key"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


class Cluster(LocalCluster):
    """A frontend and its engines; models are served as "tiny" with a small KV cache, fake ones as "fake"."""

    def start_engine(self, model: Path, index: int = 0, *extra: str) -> subprocess.Popen[bytes]:
        return super().start_engine(
            model, index, "--served-model-name", "tiny", "--kv-cache-gb", "0.05", *extra
        )

    def start_fake_engine(
        self, index: int = 0, *extra: str, cpus: str | None = None
    ) -> subprocess.Popen[bytes]:
        return super().start_fake_engine(index, "--num-kv-blocks", "2048", *extra, cpus=cpus)

    def start_serve(self, *args: str | Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``openinfer-serve`` with one CPU engine serving ``args[0]`` (a model folder) as "tiny"."""
        model, *extra = map(str, args)
        return super().start_serve(
            "--model", model, "--served-model-name", "tiny", "--kv-cache-gb", "0.05", *extra, env=env
        )

    def start_serve_fake(self, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``openinfer-serve --fake-model`` (engines of no model, served as "fake")."""
        return super().start_serve(
            "--fake-model", "--served-model-name", "fake", "--num-kv-blocks", "2048", *extra, env=env
        )


def cmdline(pid: int) -> list[str]:
    """A process's argv, as `ps` shows it to every user (Linux)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL each of these processes (a test's own children, by pid) that is still there."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
