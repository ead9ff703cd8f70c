"""``openinfer-serve -O3`` on the built-in model: the engine compiles its graphs before it serves (a step that
compiled while serving would keep the engine silent past the frontend's 5 s engine timeout), so its first
requests are answered, with the tokens an eager server gives."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from openinfer.engine_core.builtin_model import BUILTIN_MODEL_NAME
from openinfer.engine_core.launch.local_cluster import LocalCluster


def complete(url: str, prompt: str) -> str:
    body = {"model": BUILTIN_MODEL_NAME, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(json.load(response)["choices"][0]["text"])


def test_compiled_server_answers_as_eager(tmp_path: Path) -> None:
    """Eager and -O3 servers (DFlash on, the built-in default) answer the same prompts identically; the
    compiled engine logged its compiles before serving."""
    prompts = ["ROMEO: what light", "To be, or not to be: that is the question:"]
    answers = {}
    for level in ("0", "3"):
        cluster = LocalCluster(tmp_path / f"O{level}")
        cache = json.dumps({"cache_dir": str(tmp_path / "cache")})
        cluster.start_serve("-O", level, "--compilation-config", cache)
        try:
            cluster.wait_healthy(180.0)
            answers[level] = [complete(cluster.url, p) for p in prompts]
        finally:
            cluster.stop(30.0)
    assert answers["3"] == answers["0"]
    log = (tmp_path / "O3" / "serve.log").read_text()
    assert "compiled the model step" in log and log.index("compiled the model step") < log.index("is serving")
