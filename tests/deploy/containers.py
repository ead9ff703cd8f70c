"""deploy/'s images run as podman containers on the host's network: a frontend, its CPU engines, Prometheus.

Each container is started detached and removed by its id; each podman call is bounded in time
(tests/deploy/images.py's `run`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from openinfer.engine_core.launch.local_cluster import HOST, free_ports
from tests.deploy.images import Storage
from tests.deploy.stack import PROMETHEUS_DIR, LiveFrontend, Prometheus


class Containers:
    """Containers started here, by name, each removed by its id in `stop`."""

    def __init__(self, storage: Storage, work_dir: Path) -> None:
        self.storage = storage
        self.dir = work_dir  # the containers' id files
        self.ids: dict[str, str] = {}

    def start(
        self,
        name: str,
        image: str,
        args: list[str],
        mounts: tuple[tuple[Path, str, str], ...] = (),
        env: dict[str, str] | None = None,
        options: tuple[str, ...] = (),
    ) -> str:
        """``podman run -d`` of ``image`` with ``args`` for its entrypoint; ``mounts`` are (host path,
        container path, options); ``options`` more of podman run's (``--entrypoint``, ``--read-only``);
        returns the container's id."""
        flags = ["--network", "host", *options]
        for source, target, options in mounts:
            flags += ["-v", f"{source}:{target}:{options}"]
        for key, value in (env or {}).items():
            flags += ["-e", f"{key}={value}"]
        # The id file is written once the container exists: `stop` removes it even if `podman run` then
        # fails or is killed past its time (vfs copies the whole image for each container, seconds per GB).
        cidfile = self.dir / f"{name}.cid"
        try:
            self.storage.podman("run", "-d", "--cidfile", str(cidfile), *flags, image, *args, timeout=300)
        finally:
            if cidfile.exists():
                self.ids[name] = cidfile.read_text().strip()
        return self.ids[name]

    def state(self, name: str) -> dict[str, Any]:
        (info,) = json.loads(self.storage.podman("inspect", "--type", "container", self.ids[name]))
        return dict(info["State"])

    def check_alive(self) -> None:
        """Raise RuntimeError, with the logs, if any container has stopped."""
        for name in self.ids:
            state = self.state(name)
            if not state["Running"]:
                raise RuntimeError(f"container {name} exited with {state['ExitCode']}:\n{self.logs()}")

    def logs(self, chars: int = 3000) -> str:
        """The tail of every container's output."""
        return "\n".join(
            f"--- {name}\n{self.storage.podman('logs', container_id)[-chars:]}"
            for name, container_id in self.ids.items()
        )

    def stop(self) -> None:
        """Remove every container started here, by id, with its anonymous volumes (SIGKILL after 5 s)."""
        if self.ids:
            ids = self.ids.values()
            self.storage.podman("rm", "--force", "--ignore", "--volumes", "--time", "5", *ids, timeout=300)
            self.ids.clear()


class FrontendContainers(LiveFrontend):
    """The frontend image on loopback ports and CPU engine containers serving the built-in model, as "tiny",
    with its DFlash drafter; their spec logs land in ``log_dir`` (writable by the images' user)."""

    def __init__(self, containers: Containers, image: str, log_dir: Path) -> None:
        (http_port,), self.engine_port = free_ports()
        super().__init__(http_port)
        self.containers = containers
        self.log_dir = log_dir
        log_dir.mkdir(exist_ok=True)
        log_dir.chmod(0o777)
        args = [
            "--host",
            HOST,
            "--port",
            str(self.http_port),
            "--engine-bind",
            f"tcp://{HOST}:{self.engine_port}",
        ]
        containers.start("frontend", image, [*args, "--state-dir", "/state"])

    def start_engine(self, image: str, index: int, num_spec_tokens: int) -> None:
        self.spec_logs.append(self.log_dir / f"spec{index}.jsonl")
        self.num_engines += 1
        args = [
            *("--device", "cpu", "--served-model-name", "tiny", "--engine-index", str(index)),
            *("--frontend", f"tcp://{HOST}:{self.engine_port}", "--kv-cache-gb", "0.05"),
            *("--spec-method", "dflash", "--num-spec-tokens", str(num_spec_tokens)),
            *("--spec-log", f"/logs/spec{index}.jsonl"),
        ]
        self.containers.start(f"engine{index}", image, args, mounts=((self.log_dir, "/logs", "rw"),))


class PrometheusContainer(Prometheus):
    """stack.Prometheus in a container of an image whose entrypoint is Debian's `prometheus`. Its folder and
    deploy/prometheus/ are mounted at their own paths, so the configuration's paths hold inside."""

    def __init__(self, containers: Containers, image: str, work_dir: Path, env: dict[str, str]) -> None:
        # stack.Prometheus keeps a ProcessGroup only for its own start(), replaced here.
        super().__init__(None, "prometheus", work_dir, env)  # type: ignore[arg-type]
        self.containers = containers
        self.image = image

    def start(self, config: dict[str, Any]) -> None:
        config_file = self.dir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        args = [
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address={self.target}",
            "--enable-feature=expand-external-labels",
            "--log.level=warn",
        ]
        mounts = ((self.dir, str(self.dir), "rw"), (PROMETHEUS_DIR, str(PROMETHEUS_DIR), "ro"))
        self.containers.start(self.name, self.image, args, mounts=mounts, env=self.env)
