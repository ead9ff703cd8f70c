"""openinfer-serve: one command starts a frontend and N engines on the built-in model and stops them all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.e2e.processes import HOST, free_port, free_port_pair


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc), to check that none outlives the launcher."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def test_serve_builtin_model_with_two_engines(tmp_path: Path) -> None:
    """With no model it serves the built-in tiny model with its DFlash drafter (K=7); SIGTERM stops the
    frontend and both engines."""
    port, engine_port = free_port(), free_port_pair()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "openinfer.engine_core.serve",
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
        while True:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            try:
                health = json.load(urllib.request.urlopen(f"{url}/health", timeout=1))
                if health["engines_up"] == 2:
                    break
            except OSError:
                pass
            time.sleep(0.2)
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
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
    log_text = (tmp_path / "serve.log").read_text()
    assert "openinfer is serving openinfer-tiny-qwen3" in log_text
    assert "speculative decoding: dflash K=7" in log_text
