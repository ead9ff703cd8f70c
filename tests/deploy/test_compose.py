"""deploy/docker-compose.yml: Debian's docker-compose validates and resolves it (no Docker engine needed) for
the GPU default and the CPU profile, and the resolved services are wired as the frontend and engines need."""

from __future__ import annotations

import pytest

from tests.deploy.compose_files import ALWAYS, active, argv, compose_config, env_file, flag, port_pair
from tests.deploy.stack import DEPLOY


def test_gpu_default() -> None:
    """With deploy/.env as shipped (COMPOSE_PROFILES=gpu-2): the frontend, engine-0 and engine-1 each on its
    own reserved GPU as --gpu 0, the models read-only, Prometheus and Grafana."""
    assert env_file()["COMPOSE_PROFILES"] == "gpu-2"
    config = compose_config()
    services = active(config, {"gpu-2"})
    assert set(services) == ALWAYS | {"engine-0", "engine-1"}
    for index in (0, 1):
        engine = services[f"engine-{index}"]
        assert argv(engine)[:5] == ["openinfer-engine", "--gpu", "0", "--engine-index", str(index)]
        (device,) = engine["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert device["device_ids"] == [str(index)]
        assert sorted(engine["volumes"]) == sorted(
            [
                f"{env_file()['MODEL_DIR']}:/models/target:ro",
                f"{env_file()['DRAFT_MODEL_DIR']}:/models/draft:ro",
            ]
        )
        assert flag(engine, "--model") == "/models/target"
        assert flag(engine, "--num-spec-tokens") == env_file()["NUM_SPEC_TOKENS"]
        assert flag(engine, "--spec-method") == env_file()["SPEC_METHOD"]
        assert flag(engine, "--frontend") == env_file()["OPENINFER_FRONTEND"] == "tcp://frontend:5555"
        assert engine["depends_on"] == {"frontend": {"condition": "service_started"}}
    assert (services["frontend"].get("environment") or {}).get("OPENINFER_API_KEY") is None  # no key, not ""
    with_key = compose_config(OPENINFER_API_KEY="sekrit")["services"]["frontend"]
    assert with_key["environment"]["OPENINFER_API_KEY"] == "sekrit"


def test_number_of_engines_is_a_profile() -> None:
    """gpu-N runs engine-0 .. engine-(N-1) on N distinct GPUs; GPU ids and the frontend's address come from
    the environment."""
    for n in range(1, 9):
        running = set(active(compose_config(), {f"gpu-{n}"})) - ALWAYS
        assert running == {f"engine-{i}" for i in range(n)}, n
    config = compose_config(ENGINE_1_GPU="5", OPENINFER_FRONTEND="tcp://10.0.0.5:5555")
    engines = {name: s for name, s in active(config, {"gpu-8"}).items() if name.startswith("engine-")}
    gpus = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0] for s in engines.values()]
    assert sorted(gpus) == ["0", "2", "3", "4", "5", "5", "6", "7"]  # ENGINE_1_GPU=5 collides with engine-5's
    assert {flag(s, "--engine-index") for s in engines.values()} == {str(i) for i in range(8)}
    assert {flag(s, "--frontend") for s in engines.values()} == {"tcp://10.0.0.5:5555"}


@pytest.mark.parametrize("how", ["env", "flag"])
def test_cpu_profile(how: str) -> None:
    """COMPOSE_PROFILES=cpu (or --profile cpu): two CPU engines, the built-in model (no --model), its DSpark
    drafter, connecting to the frontend's engine port."""
    config = compose_config(COMPOSE_PROFILES="cpu") if how == "env" else compose_config("--profile", "cpu")
    services = active(config, {"cpu"})
    assert set(services) == ALWAYS | {"cpu-engine-0", "cpu-engine-1"}
    for index in (0, 1):
        engine = services[f"cpu-engine-{index}"]
        assert argv(engine)[:5] == ["openinfer-engine", "--device", "cpu", "--engine-index", str(index)]
        assert "--model" not in argv(engine) and "--gpu" not in argv(engine)
        assert flag(engine, "--spec-method") == "dspark"
        assert flag(engine, "--frontend") == "tcp://frontend:5555"
        assert engine["build"]["dockerfile"] == "deploy/Dockerfile.cpu"
        assert "deploy" not in engine


def test_frontend_ports_healthchecks_and_restarts() -> None:
    """The frontend binds its engine port and the next one and publishes both with HTTP; every service has
    a healthcheck and a restart policy; Grafana waits for a healthy Prometheus."""
    services = compose_config()["services"]
    frontend = services["frontend"]
    assert flag(frontend, "--engine-bind") == "tcp://0.0.0.0:5555"
    published = {port_pair(p) for p in frontend["ports"]}
    assert published == {(8000, 8000), (5555, 5555), (5556, 5556)}
    assert "/health" in " ".join(frontend["healthcheck"]["test"])
    for name, service in services.items():
        assert service["restart"] == "unless-stopped", name
        assert service["healthcheck"]["test"][0] == "CMD", name
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    assert services["prometheus"]["environment"]["OPENINFER_HOST"] == env_file()["OPENINFER_HOST"]
    assert "--enable-feature=expand-external-labels" in services["prometheus"]["command"]


def test_frontend_image_installs_no_torch() -> None:
    """The slim frontend image installs openinfer without its dependencies, then only the frontend's."""
    dockerfile = (DEPLOY / "Dockerfile.frontend").read_text()
    assert "pip install --no-deps ." in dockerfile
    assert "pip install -r /tmp/frontend-requirements.txt" in dockerfile
    requirements = (DEPLOY / "frontend-requirements.txt").read_text().splitlines()
    assert not [line for line in requirements if "torch" in line and not line.startswith("#")]
    engine = (DEPLOY / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=nvidia/cuda:" in engine and "FROM ${BASE_IMAGE}" in engine
    assert '".[gpu]"' in engine and "TORCH_VERSION=" in engine
    cpu = (DEPLOY / "Dockerfile.cpu").read_text()  # torch from PyTorch's CPU index unless told otherwise
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in cpu
    assert '--index-url "${TORCH_INDEX_URL}"' in cpu


def test_commands_parse_with_the_real_clis() -> None:
    """Every resolved command line is accepted by openinfer-frontend's and openinfer-engine's parsers."""
    from openinfer.engine_core.process.engine_cli import parse_args as engine_args
    from openinfer.frontend.process.main import parse_args as frontend_args

    services = compose_config()["services"]
    frontend = frontend_args(services["frontend"]["command"])
    assert (frontend.port, frontend.engine_bind, str(frontend.state_dir)) == (
        8000,
        "tcp://0.0.0.0:5555",
        "/state",
    )
    for name, service in services.items():
        if "engine" in name:
            entrypoint, *args = argv(service)
            assert entrypoint == "openinfer-engine"
            parsed = engine_args(args)
            assert parsed.frontend_addresses == ["tcp://frontend:5555"], name
            assert parsed.num_spec_tokens == 7, name
