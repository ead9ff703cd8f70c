"""openinfer-serve: one command starts a frontend and N engines on the built-in model and stops them all; a
positional model, CurveZMQ keys it makes itself, an API key kept off command lines; vLLM flags it lacks."""

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

import pytest

from openinfer.engine_core.launch.local_cluster import LocalCluster
from tests.e2e.processes import HOST, Cluster, cmdline, free_ports, kill_all, serve_children


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc), to check that none outlives the launcher."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def test_serve_builtin_model_with_two_engines(tmp_path: Path) -> None:
    """With no model it serves the built-in tiny model with its DSpark drafter (K=7); SIGTERM stops the
    frontend and both engines."""
    (port,), engine_port = free_ports()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "openinfer.engine_core.launch.serve",
            "--engines",
            "2",
            "--host",
            HOST,
            "--port",
            str(port),
            "--engine-port",
            str(engine_port),
            "--kv-cache-gb",
            "0.05",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    children: list[int] = []
    try:
        url = f"http://{HOST}:{port}"
        deadline = time.monotonic() + 90
        while "openinfer is serving" not in (tmp_path / "serve.log").read_text():  # what a user waits for
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        assert json.load(urllib.request.urlopen(f"{url}/health", timeout=5))["engines_up"] == 2
        children = child_pids(serve.pid)
        assert len(children) == 3  # frontend + 2 engines
        body = json.dumps({"prompt": "ROMEO:", "max_tokens": 5, "temperature": 0}).encode()
        request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
        completion = json.load(urllib.request.urlopen(request, timeout=30))
        assert completion["model"] == "openinfer-tiny-qwen3"
        assert completion["usage"]["completion_tokens"] <= 5
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
        for pid in children:  # every child was reaped by the launcher
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        kill_all(children)
        log.close()
    log_text = (tmp_path / "serve.log").read_text()
    assert "openinfer is serving openinfer-tiny-qwen3" in log_text
    assert "speculative decoding: dspark K=7" in log_text


def test_serve_model_positional_with_curve_keys_and_an_api_key(tmp_path: Path, tiny_model: Path) -> None:
    """`openinfer-serve MODEL --zmq-curve-keys DIR --api-key KEY`: keys are made in the empty DIR and the
    frontend and engine run with them; one request with the key is served (401 without); the key is on
    neither child's command line (what `ps` shows): the frontend has it in its environment."""
    keys = tmp_path / "keys"
    cluster = Cluster(tmp_path / "logs")
    seen: list[int] = []
    try:
        serve = LocalCluster.start_serve(
            cluster, str(tiny_model), "--served-model-name", "tiny", "--kv-cache-gb", "0.05",
            "--zmq-curve-keys", str(keys), "--api-key", "k3y-for-the-test",
        )  # fmt: skip
        cluster.wait_healthy(90)
        roles = serve_children(serve.pid)
        seen += roles.values()
        assert sorted(roles) == ["engine0", "frontend"]
        for pid in roles.values():
            assert not any("k3y-for-the-test" in arg for arg in cmdline(pid))
            assert f"--zmq-curve-keys={keys}" in cmdline(pid)
        environ = Path(f"/proc/{roles['frontend']}/environ").read_bytes().split(b"\0")
        assert b"OPENINFER_API_KEY=k3y-for-the-test" in environ
        assert (keys / "frontend.key").is_file() and (keys / "engines" / "engine-0.key_secret").is_file()
        body = json.dumps({"model": "tiny", "prompt": "ROMEO:", "max_tokens": 4, "temperature": 0}).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(f"{cluster.url}/v1/completions", body, headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 401
        headers["Authorization"] = "Bearer k3y-for-the-test"
        request = urllib.request.Request(f"{cluster.url}/v1/completions", body, headers)
        completion = json.load(urllib.request.urlopen(request, timeout=30))
        assert completion["model"] == "tiny" and completion["usage"]["completion_tokens"] == 4
    finally:
        cluster.stop(30)
        kill_all(seen)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["-pp", "2"], "--pipeline-parallel-size 2 is vLLM's; openinfer has no pipeline parallelism"),
        (
            ["--quantization", "fp8"],
            "--quantization fp8 is vLLM's; openinfer serves unquantized weights only",
        ),
    ],
)
def test_serve_refuses_vllm_flags_it_lacks(flags: list[str], words: str) -> None:
    """A vLLM command line with a flag openinfer lacks: exit 2 at once, saying what to do instead."""
    done = subprocess.run(
        [sys.executable, "-m", "openinfer.engine_core.launch.serve", *flags],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and words in done.stderr
