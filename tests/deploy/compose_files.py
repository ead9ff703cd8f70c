"""deploy/docker-compose.yml and docker-compose.fleet.yml resolved by Debian's docker-compose (no Docker engine
needed), and readers of the resolved services: what the compose and CUDA image tests check."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.stack import DEPLOY, require_tools

COMPOSE_FILE = DEPLOY / "docker-compose.yml"
FLEET_FILE = DEPLOY / "docker-compose.fleet.yml"
FLEET_ENV_FILE = DEPLOY / "fleet.env"
ALWAYS = {"frontend", "prometheus", "grafana"}


def compose_config(*flags: str, **env: str) -> dict[str, Any]:
    """`docker-compose -f deploy/docker-compose.yml [flags] config`, with deploy/.env and ``env``, parsed."""
    return resolved(["-f", str(COMPOSE_FILE), *flags], env)


def fleet_config(*flags: str, **env: str) -> dict[str, Any]:
    """`docker-compose -f deploy/docker-compose.fleet.yml --env-file deploy/fleet.env [flags] config`, parsed."""
    return resolved(["-f", str(FLEET_FILE), "--env-file", str(FLEET_ENV_FILE), *flags], env)


def resolved(options: list[str], env: dict[str, str]) -> dict[str, Any]:
    require_tools("docker-compose")
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COMPOSE_", "OPENINFER_", "DOCKER_", "ROUTER_", "NODE_", "KV_"))
    }
    result = subprocess.run(
        ["docker-compose", *options, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return yaml.safe_load(result.stdout)


def active(config: dict[str, Any], profiles: set[str]) -> dict[str, dict[str, Any]]:
    """The services `up` starts with these profiles: those in none, and those in one of them."""
    return {
        name: service
        for name, service in config["services"].items()
        if not service.get("profiles") or profiles & set(service["profiles"])
    }


def argv(service: dict[str, Any]) -> list[str]:
    return [*service.get("entrypoint", []), *service.get("command", [])]


def flag(service: dict[str, Any], name: str) -> str:
    args = argv(service)
    return args[args.index(name) + 1]


def port_pair(port: str | dict[str, Any]) -> tuple[int, int]:
    """(container port, published port) of a resolved ports entry: compose v1 writes "IP:PUB:TARGET/tcp",
    v2 a mapping."""
    if isinstance(port, dict):
        return int(port["target"]), int(port["published"])
    *_, published, target = port.split("/")[0].split(":")
    return int(target), int(published)


def env_file(path: Path = DEPLOY / ".env") -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
