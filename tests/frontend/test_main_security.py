"""`openinfer-frontend` is safe by default: keys from the environment (out of `ps`), engine ports on loopback,
loud warnings for what is open to the network, the admin routes off without a key, no CORS unless asked,
only loopback Host names on a loopback address."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import aiohttp
import pytest

from openinfer.engine_core.launch.local_cluster import free_ports
from openinfer.frontend.addresses import is_loopback_host
from openinfer.frontend.openai.cors import CorsPolicy
from openinfer.frontend.process.main import cors_policy, parse_args

_KEY_VARIABLES = ("OPENINFER_API_KEY", "VLLM_API_KEY", "OPENINFER_ADMIN_API_KEY")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("env", "argv", "api_key", "admin_api_key"),
    [
        ({}, [], None, None),
        ({"VLLM_API_KEY": "v"}, [], "v", None),  # vLLM's variable
        ({"OPENINFER_API_KEY": "o", "VLLM_API_KEY": "v"}, [], "o", None),  # ours first
        ({"OPENINFER_API_KEY": "", "VLLM_API_KEY": "v"}, [], "v", None),  # empty means unset
        ({"OPENINFER_API_KEY": "o"}, ["--api-key", "flag"], "flag", None),  # the flag wins
        ({"OPENINFER_ADMIN_API_KEY": "a"}, [], None, "a"),
        ({}, ["--admin-api-key", "a"], None, "a"),
    ],
)
def test_keys_come_from_flags_or_the_environment(
    clean_env: pytest.MonkeyPatch,
    env: dict[str, str],
    argv: list[str],
    api_key: str | None,
    admin_api_key: str | None,
) -> None:
    """--api-key, else $OPENINFER_API_KEY, else $VLLM_API_KEY; --admin-api-key, else $OPENINFER_ADMIN_API_KEY."""
    for name, value in env.items():
        clean_env.setenv(name, value)
    args = parse_args(argv)
    assert (args.api_key, args.admin_api_key) == (api_key, admin_api_key)


def test_engine_ports_bind_on_loopback_by_default(clean_env: pytest.MonkeyPatch) -> None:
    """Engines elsewhere need an explicit --engine-bind; HTTP keeps vLLM's every-interface default."""
    args = parse_args([])
    assert (args.engine_bind, args.host) == ("tcp://127.0.0.1:5555", "0.0.0.0")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("*", False),
        ("::", False),
        ("10.1.2.3", False),
        ("eth0", False),  # a ZeroMQ interface name: off-host
        ("frontend.example", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    """Only addresses nothing off this machine can reach count as loopback."""
    assert is_loopback_host(host) is loopback


async def run_frontend(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    """The frontend as a process with these key variables (and no others from this environment)."""
    child_env = {k: v for k, v in os.environ.items() if k not in _KEY_VARIABLES} | env
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "openinfer.frontend.process.main", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=child_env,
    )  # fmt: skip


async def wait_listening(url: str, timeout: float = 15.0) -> None:
    """Until HTTP answers at all (/health is 503 without engines)."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{url}/health"):
                    return
            except aiohttp.ClientConnectionError:
                assert asyncio.get_running_loop().time() < deadline, "the frontend never listened"
                await asyncio.sleep(0.05)


async def stop(process: asyncio.subprocess.Process) -> str:
    """SIGTERM, then its whole log (killed if it does not stop in 10 s)."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.stdout is not None
    return (await process.stdout.read()).decode()


async def test_off_host_listening_without_keys_warns_loudly() -> None:
    """Engine ports on 0.0.0.0 without --zmq-curve-keys, HTTP on 0.0.0.0 without a key: a SECURITY warning
    each, naming the fix (the HTTP one also says that, the Host check being off, DNS rebinding is open)."""
    (http_port,), engine_port = free_ports()
    process = await run_frontend(
        {}, "--host", "0.0.0.0", "--port", str(http_port), "--engine-bind", f"tcp://0.0.0.0:{engine_port}"
    )
    try:
        await wait_listening(f"http://127.0.0.1:{http_port}")
    finally:
        log = await stop(process)
    engines = f"SECURITY: the engine sockets listen on 0.0.0.0 (ports {engine_port} and {engine_port + 1})"
    assert engines in log and "--zmq-curve-keys DIR" in log
    assert f"SECURITY: HTTP listens on 0.0.0.0:{http_port} without an API key" in log
    assert "by DNS rebinding (the Host check is only on for a loopback --host)" in log
    assert "OPENINFER_API_KEY" in log


async def test_env_key_guards_the_api_and_opens_admin_and_loopback_warns_of_engines_only() -> None:
    """$VLLM_API_KEY alone (no flag, so not in `ps`): /v1 and /admin need it, /health does not; on loopback
    with a key HTTP is not warned about, the engine sockets without --zmq-curve-keys are (any local process
    could join as an engine), naming the fix."""
    (http_port,), engine_port = free_ports()
    url = f"http://127.0.0.1:{http_port}"
    argv = [
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
        "--engine-bind",
        f"tcp://127.0.0.1:{engine_port}",
    ]
    process = await run_frontend({"VLLM_API_KEY": "from-env"}, *argv)
    try:
        await wait_listening(url)
        async with aiohttp.ClientSession() as session:
            key = {"Authorization": "Bearer from-env"}
            for path, headers, status in [
                ("/v1/models", None, 401),
                ("/v1/models", key, 200),
                ("/admin/engines", None, 401),
                ("/admin/engines", key, 200),
                ("/health", None, 503),  # no engine; open without a key
            ]:
                async with session.get(f"{url}{path}", headers=headers) as response:
                    assert response.status == status, (path, headers)
    finally:
        log = await stop(process)
    assert "SECURITY: HTTP" not in log and "from-env" not in log
    engines = f"SECURITY: the engine sockets listen on 127.0.0.1 (ports {engine_port} and {engine_port + 1})"
    assert engines in log and "any process on this host can join as an engine" in log
    assert "openinfer-keys DIR" in log and "--zmq-curve-keys DIR" in log


@pytest.mark.parametrize(
    "value",
    ['"http://a.example"', "[1]", "not json", '{"origins": []}'],
    ids=["string", "ints", "text", "object"],
)
def test_cors_flags_take_json_lists_of_strings(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--allowed-origins & co. are vLLM's JSON lists; anything else is a usage error saying so."""
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--allowed-origins", value])
    assert exit_info.value.code == 2 and "must be a JSON list of strings" in capsys.readouterr().err


def test_no_cors_without_allowed_origins() -> None:
    """No --allowed-origins: no policy (no CORS headers), whatever the other CORS flags say; with it, the
    four flags make the policy."""
    assert cors_policy(parse_args(["--allowed-methods", '["GET"]', "--allow-credentials"])) is None
    args = parse_args(["--allowed-origins", '["http://a.example"]', "--allowed-headers", '["X-A"]'])
    assert cors_policy(args) == CorsPolicy(("http://a.example",), ("*",), ("X-A",), False)


async def test_loopback_frontend_refuses_other_hosts_and_answers_allowed_origins() -> None:
    """openinfer-frontend on 127.0.0.1 with --allowed-origins: a request for Host evil.example is a 400
    saying how to listen elsewhere; one from the allowed origin is told so; a text/plain body is refused."""
    (http_port,), engine_port = free_ports()
    url = f"http://127.0.0.1:{http_port}"
    argv = [
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
        "--engine-bind",
        f"tcp://127.0.0.1:{engine_port}",
    ]
    process = await run_frontend({}, *argv, "--allowed-origins", '["http://app.example"]')
    try:
        await wait_listening(url)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/v1/models", headers={"Host": "evil.example:8000"}) as response:
                error = (await response.json())["error"]
                assert response.status == 400 and "--host 0.0.0.0" in error["message"]
            async with session.get(f"{url}/v1/models", headers={"Origin": "http://app.example"}) as response:
                assert response.status == 200
                assert response.headers["Access-Control-Allow-Origin"] == "http://app.example"
            async with session.post(
                f"{url}/v1/completions", data="{}", headers={"Content-Type": "text/plain"}
            ) as r:
                assert r.status == 400 and (await r.json())["error"]["code"] == "unsupported_media_type"
    finally:
        await stop(process)


async def test_any_origin_without_a_key_warns_loudly() -> None:
    """--allowed-origins '["*"]' and no API key: a SECURITY warning that any web page can use the API."""
    (http_port,), engine_port = free_ports()
    argv = [
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
        "--engine-bind",
        f"tcp://127.0.0.1:{engine_port}",
    ]
    process = await run_frontend({}, *argv, "--allowed-origins", '["*"]')
    try:
        await wait_listening(f"http://127.0.0.1:{http_port}")
    finally:
        log = await stop(process)
    assert "SECURITY: --allowed-origins '[\"*\"]' without an API key" in log
