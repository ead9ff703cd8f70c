"""Real openinfer frontends, CPU engines and Prometheus servers on loopback for the deploy tests.

Every process is a child started here and stopped by its pid. Prometheus configurations are deploy/'s own,
with only what a test must change: loopback targets, 1 s intervals, absolute rule paths.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from openinfer.engine_core.launch.local_cluster import (
    HOST,
    ProcessGroup,
    free_port,
    free_ports,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
SLIM_FRONTEND = Path(__file__).resolve().parent / "slim_frontend.py"
# The compose service every host's Prometheus scrapes: host-level series all carry this instance label, so
# only the `host` external label tells two hosts' series apart on a global Prometheus (as in production).
COMPOSE_FRONTEND = "frontend:8000"


def require_tools(*tools: str) -> None:
    """Skip the calling test unless every tool is on PATH (.ci/run installs them from Debian)."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: `apt-get install prometheus docker-compose` "
            "(Debian's packages; .ci/run installs them)"
        )


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


class LiveFrontend:
    """A frontend on loopback and its engines' spec logs, however they run (processes, containers)."""

    def __init__(self, http_port: int) -> None:
        self.http_port = http_port
        self.url = f"http://{HOST}:{http_port}"
        self.target = f"{HOST}:{http_port}"
        self.spec_logs: list[Path] = []
        self.num_engines = 0

    def healthy(self) -> bool:
        try:
            return get_json(f"{self.url}/health", timeout=1)["engines_up"] >= self.num_engines
        except (urllib.error.URLError, OSError, KeyError):
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            return response.read().decode()


class Frontend(LiveFrontend):
    """A slim frontend (tests/deploy/slim_frontend.py) and its CPU engines with n-gram speculation."""

    def __init__(self, processes: ProcessGroup, name: str) -> None:
        (http_port,), self.engine_port = free_ports()
        super().__init__(http_port)
        self.processes = processes
        self.name = name
        processes.spawn(
            name,
            [
                sys.executable,
                str(SLIM_FRONTEND),
                "--host",
                HOST,
                "--port",
                str(self.http_port),
                "--engine-bind",
                f"tcp://{HOST}:{self.engine_port}",
            ],
        )

    def start_engine(self, model: Path, index: int, num_spec_tokens: int) -> None:
        spec_log = self.processes.log_dir / f"{self.name}-spec{index}.jsonl"
        self.spec_logs.append(spec_log)
        self.num_engines += 1
        self.processes.spawn(
            f"{self.name}-engine{index}",
            [
                str(Path(sys.executable).parent / "openinfer-engine"),  # the console script, as in the images
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
                "--spec-method",
                "ngram",
                "--num-spec-tokens",
                str(num_spec_tokens),
                "--spec-log",
                str(spec_log),
            ],
        )


def host_config(frontend: LiveFrontend, self_target: str) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml for a test host: its frontend on loopback, scrape and rules every 1 s."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(PROMETHEUS_DIR / path) for path in config["rule_files"]]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["openinfer-frontend"]["static_configs"] == [{"targets": [COMPOSE_FRONTEND]}]
    jobs["openinfer-frontend"]["static_configs"] = [{"targets": [frontend.target]}]
    jobs["openinfer-frontend"]["relabel_configs"] = [
        {"target_label": "instance", "replacement": COMPOSE_FRONTEND}
    ]
    jobs["prometheus"]["static_configs"] = [{"targets": [self_target]}]
    return config


def global_config(host_targets: list[str]) -> dict[str, Any]:
    """deploy/prometheus/federation.yml federating these host Prometheus servers every 1 s."""
    config = yaml.safe_load((PROMETHEUS_DIR / "federation.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(PROMETHEUS_DIR / path) for path in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": host_targets}]
    return config


class Prometheus:
    """A ``prometheus`` server (Debian's binary) on a free loopback port, with its own storage."""

    def __init__(
        self, processes: ProcessGroup, name: str, work_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.processes = processes
        self.name = name
        self.dir = work_dir / name
        self.dir.mkdir()
        self.port = free_port()
        self.target = f"{HOST}:{self.port}"
        self.url = f"http://{self.target}"
        self.env = env or {}

    def start(self, config: dict[str, Any]) -> None:
        config_file = self.dir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        self.processes.spawn(
            self.name,
            [
                "prometheus",
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address={self.target}",
                "--enable-feature=expand-external-labels",
                "--log.level=warn",
            ],
            env=self.env,
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The result of an instant query (at unix time ``at``, default now); raises on a query error."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        body = get_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}")
        assert body["status"] == "success", body
        return body["data"]["result"]

    def vector(self, expr: str, at: float | None = None, *labels: str) -> dict[tuple[str, ...], float]:
        """An instant vector as {values of ``labels``: value}."""
        return {
            tuple(sample["metric"].get(label, "") for label in labels): float(sample["value"][1])
            for sample in self.query(expr, at)
        }

    def samples(self, expr: str, at: float | None = None) -> list[tuple[float, float]]:
        """The raw (timestamp, value) samples of a range selector of at most one series, e.g. ``x[30s]``."""
        result = self.query(expr, at)
        assert len(result) <= 1, (expr, result)
        return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []


class Watched(Protocol):
    """What wait_until watches while it polls: a ProcessGroup, or tests/deploy/images.py's Containers."""

    def check_alive(self) -> None: ...

    def logs(self, chars: int = 3000) -> str: ...


def wait_until(condition: Any, timeout: float, what: str, processes: Watched) -> None:
    """Poll ``condition()`` every 0.1 s; raise with the children's logs after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        processes.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout} s\n{processes.logs()}")
        time.sleep(0.1)
