"""`openinfer-frontend` as a real process: it serves, logs where it listens and who joins, stops cleanly."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from openinfer.engine_core.launch.local_cluster import free_port, free_ports
from openinfer.frontend.metrics.state_dir import STATE_FILE, StateDir
from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from openinfer.frontend.process.main import parse_args
from tests.frontend.frontends import FakeEngine


async def run_main(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "openinfer.frontend.process.main", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


async def wait_for_health(url: str, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{url}/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            assert asyncio.get_running_loop().time() < deadline, "the frontend never became healthy"
            await asyncio.sleep(0.05)


async def test_frontend_process_serves_and_exits_cleanly_on_sigterm(fake_engine: FakeEngine) -> None:
    """The process serves a completion from a connected engine (a real --fake-model engine process), logs
    listen/join lines, exits 0 on SIGTERM."""
    http_port, engine_address = free_port(), fake_engine.address
    fake_engine.ports.release()
    process = await run_main("--host", "127.0.0.1", "--port", str(http_port), "--engine-bind", engine_address)
    try:
        url = f"http://127.0.0.1:{http_port}"
        await wait_for_health(url, timeout=60)  # the session's engine may be starting
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "hello", "max_tokens": 2, "ignore_eos": True}
            async with session.post(f"{url}/v1/completions", json=body) as response:
                assert response.status == 200
                assert (await response.json())["usage"]["completion_tokens"] == 2
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
        assert process.stdout is not None
        log = (await process.stdout.read()).decode()
        assert f"listening on http://127.0.0.1:{http_port}" in log
        assert "engine 0 (incarnation" in log and "joined" in log
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        fake_engine.ports.hold()


async def test_bad_engine_address_is_a_usage_error() -> None:
    """An --engine-bind that is not tcp://HOST:PORT stops the process with exit 2 and says what to write."""
    process = await run_main("--port", str(free_port()), "--engine-bind", "localhost:5555")
    try:
        assert await asyncio.wait_for(process.wait(), timeout=10) == 2
        assert process.stdout is not None
        assert "must look like tcp://HOST:PORT" in (await process.stdout.read()).decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_engine_port_in_use_exits_1_with_a_clear_message() -> None:
    """A taken engine port stops the process with exit 1 and a log line saying it could not start."""
    (http_port,), port = free_ports()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        process = await run_main("--port", str(http_port), "--engine-bind", f"tcp://127.0.0.1:{port}")
        try:
            assert await asyncio.wait_for(process.wait(), timeout=10) == 1
            assert process.stdout is not None
            assert "could not start" in (await process.stdout.read()).decode()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_unusable_state_dir_or_keys_exit_1_saying_why(tmp_path: Path) -> None:
    """A --state-dir another frontend holds, a corrupt state file, or a keys folder without the frontend's
    key: exit 1, with the reason in the log."""
    holder = StateDir(tmp_path / "held")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / STATE_FILE).write_text("{")
    cases = [
        (["--state-dir", str(tmp_path / "held")], "in use by another frontend"),
        (["--state-dir", str(corrupt)], "move it away"),
        (["--zmq-curve-keys", str(tmp_path / "nokeys")], "openinfer-keys"),
    ]
    try:
        for args, message in cases:
            (http_port,), engine_port = free_ports()
            engine_bind = f"tcp://127.0.0.1:{engine_port}"
            process = await run_main("--port", str(http_port), "--engine-bind", engine_bind, *args)
            try:
                assert await asyncio.wait_for(process.wait(), timeout=10) == 1
                assert process.stdout is not None
                assert message in (await process.stdout.read()).decode()
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    finally:
        holder.close()


def test_chat_parser_flags() -> None:
    """vLLM's flags make the chat parsers; none by default (the output is left as written)."""
    assert parse_args([]).chat_parsers == ChatParsers()
    argv = ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert parse_args(argv).chat_parsers == ChatParsers("qwen3", "hermes", enable_auto_tool_choice=True)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--reasoning-parser", "deepseek_r1"],
            "unknown reasoning parser 'deepseek_r1'; openinfer has: qwen3",
        ),
        (["--tool-call-parser", "pythonic"], "unknown tool call parser 'pythonic'; openinfer has: hermes"),
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
    ],
)
def test_parsers_that_cannot_work_are_refused_at_start(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error naming the problem, before anything starts."""
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert words in capsys.readouterr().err


def test_timeout_flags_and_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """--grammar-check-timeout (5 s), --chat-template-timeout (5 s), --http-timeout-keep-alive (vLLM's
    $VLLM_HTTP_TIMEOUT_KEEP_ALIVE, else 5 s) and --http-timeout-body (60 s) reach the frontend from
    openinfer-serve as given; a non-positive one is a usage error."""
    from openinfer.engine_core.launch.serve import frontend_command
    from openinfer.engine_core.launch.serve import parse_args as serve_args

    monkeypatch.delenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", raising=False)
    args = parse_args([])
    timeouts = (
        "grammar_check_timeout",
        "chat_template_timeout",
        "http_timeout_keep_alive",
        "http_timeout_body",
    )
    assert tuple(getattr(args, name) for name in timeouts) == (5.0, 5.0, 5.0, 60.0)
    monkeypatch.setenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "300")
    assert parse_args([]).http_timeout_keep_alive == 300.0
    argv = ["--grammar-check-timeout", "2.5", "--chat-template-timeout", "3"]
    argv += ["--http-timeout-keep-alive", "7", "--http-timeout-body", "9"]
    served = parse_args(frontend_command(serve_args(argv))[3:])  # after `python -m module`
    assert tuple(getattr(served, name) for name in timeouts) == (2.5, 3, 7, 9)
    for flag in ("--grammar-check-timeout", "--chat-template-timeout", "--http-timeout-body"):
        with pytest.raises(SystemExit):
            parse_args([flag, "0"])


@pytest.mark.parametrize("value", ["soon", "0", "-5"])
def test_a_bad_keep_alive_variable_is_named_in_the_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """$VLLM_HTTP_TIMEOUT_KEEP_ALIVE that is not a positive number: a usage error that names the variable
    (not the flag, which the user never typed) and how to fix it; with the flag given, the variable is not
    read."""
    monkeypatch.setenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", value)
    with pytest.raises(SystemExit) as exit_info:
        parse_args([])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "argument --http-timeout-keep-alive" not in error
    assert (
        f"$VLLM_HTTP_TIMEOUT_KEEP_ALIVE (the default of --http-timeout-keep-alive) must be a positive number "
        f"of seconds, got {value!r}: fix or unset it, or pass --http-timeout-keep-alive" in error
    )
    assert parse_args(["--http-timeout-keep-alive", "3"]).http_timeout_keep_alive == 3.0
