"""The benchmarks' frontend and --fake-model engines: openinfer.engine_core.launch.local_cluster with quiet logs and
room for many requests. Each process can be pinned to CPU cores (taskset), so that the frontend's own
capacity is measured on a core of its own."""

from __future__ import annotations

import subprocess

from openinfer.engine_core.launch import local_cluster


class LocalCluster(local_cluster.LocalCluster):
    """A frontend and fake engines for load: warnings only in the logs, 8192 KV blocks, 256 sequences."""

    def start_frontend(
        self,
        *extra: str,
        cpus: str | None = None,
        index: int = 0,
        http_port: int | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> subprocess.Popen[bytes]:
        return super().start_frontend(
            "--log-level", "warning", *extra, cpus=cpus, index=index, http_port=http_port, pass_fds=pass_fds
        )

    def start_fake_engine(
        self, index: int = 0, *extra: str, cpus: str | None = None
    ) -> subprocess.Popen[bytes]:
        quiet = ("--num-kv-blocks", "8192", "--max-num-seqs", "256", "--log-level", "warning")
        return super().start_fake_engine(index, *quiet, *extra, cpus=cpus)

    def wait_engines(self, engines: int, timeout: float = 60.0) -> None:
        """Until `engines` engines are up (/health)."""
        self.wait_healthy(timeout, engines)
