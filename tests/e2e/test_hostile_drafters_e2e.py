"""Hostile DSpark folders loaded at run time through the admin route (issue 39, item 3), on a real frontend and
engine: each is refused (400) while the engine keeps drafting with its start drafter, and its log says why;
given at start, the engine exits 2 saying why (before it sizes its KV cache from the folder)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from safetensors.torch import load_file, save_file

from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from tests.e2e.fault_checks import admin_engines
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster

K = 7  # the start drafter's block_size: the engine takes K from the folder
# Folder -> the reason the engine's log gives (the client is told only that the path did not load).
HOSTILE = {
    "block-1e9": "block_size must be an integer, got 1000000000.0 (float)",
    "layers-1e6": "num_hidden_layers must be in [1, 1024], got 1000000",
    "nan": "'fc.weight' holds NaN or infinite values",
    "inf": "'markov_head.markov_w2.weight' holds NaN or infinite values",
    "misshapen": "'layers.0.mlp.down_proj.weight' has shape (64, 128), the config says (64, 96)",
    "truncated": "model.safetensors is not a valid safetensors file",
    "rope-list": "rope_scaling must be an object, got ['yarn'] (list)",
    "wide": "num_attention_heads x head_dim is 1048576, more than 8 x the hidden size (512)",
}


def make_hostile(good: Path, name: str) -> Path:
    """A copy of ``good`` made hostile as ``name`` says."""
    folder = Path(shutil.copytree(good, good.parent / name))
    config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    weights = load_file(folder / "model.safetensors")
    if name == "block-1e9":
        config["block_size"] = 1e9
    elif name == "layers-1e6":
        config["num_hidden_layers"] = 10**6
    elif name == "misshapen":
        config["intermediate_size"] = 96  # the weights are 128 wide
    elif name == "rope-list":
        config["rope_scaling"] = ["yarn"]
    elif name == "wide":  # at start, its KV pages alone were more than the cache: sizing failed first
        config["num_attention_heads"] = config["num_key_value_heads"] = 2**16
    elif name == "nan":
        weights["fc.weight"] = torch.full_like(weights["fc.weight"], float("nan"))
    elif name == "inf":
        weights["markov_head.markov_w2.weight"][3, 2] = float("inf")
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, str(folder / "model.safetensors"))
    if name == "truncated":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    return folder


@pytest.fixture(scope="module")
def drafters(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """The allowed folder: a good DSpark drafter and the hostile copies of it."""
    root = tmp_path_factory.mktemp("drafters")
    good = make_tiny_dspark_checkpoint(root / "good", tiny_model, seed=2, block_size=K)
    for name in HOSTILE:
        make_hostile(good, name)
    return root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, drafters: Path) -> Iterator[Cluster]:
    """A frontend (admin routes on, drafter commands waited for 60 s at most) and an engine drafting with
    the good DSpark drafter, every draft verified (its random confidences would leave them out), loading
    others only from ``drafters``."""
    c = Cluster(tmp_path_factory.mktemp("hostile-drafters"))
    try:
        c.start_frontend("--admin-api-key", ADMIN_KEY, "--drafter-timeout", "60")
        c.start_engine(tiny_model, 0, "--draft-model", str(drafters / "good"),
                       "--allowed-drafter-dir", str(drafters), "--no-enable-adaptive-verification")  # fmt: skip
        c.wait_healthy()
        yield c
    finally:
        c.stop()


async def complete(session: aiohttp.ClientSession, url: str) -> None:
    body = {
        "model": "tiny",
        "prompt": "ROMEO: But soft",
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
    }
    async with session.post(f"{url}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(60)) as r:
        assert r.status == 200, await r.text()


def num_drafts(c: Cluster) -> int:
    engine = admin_engines(c)[0]
    assert engine["num_spec_tokens"] == K  # the start drafter
    return int(engine["load"]["spec_decode"]["num_drafts"])


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_a_hostile_drafter_is_refused_and_the_start_drafter_serves_on(
    cluster: Cluster, drafters: Path, name: str
) -> None:
    """POST /admin/engines/0/drafter with a hostile folder: 400 naming only the path (no 200, no 504);
    the engine's log gives the reason; then requests are drafted by the start drafter, K unchanged."""
    path = str(drafters / name)
    body = {"method": "dspark", "num_spec_tokens": K, "draft_model": path}
    async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as s:
        async with s.post(
            f"{cluster.url}/admin/engines/0/drafter", json=body, timeout=aiohttp.ClientTimeout(90)
        ) as r:
            status, error = r.status, (await r.json())["error"]
        assert (status, error["code"]) == (400, "drafter_refused"), error
        assert error["message"] == (
            f"cannot load a drafter from the path given ({path!r}); the engine's log says why"
        )
        before = num_drafts(cluster)
        await complete(s, cluster.url)
        assert num_drafts(cluster) > before
    assert logged(cluster, HOSTILE[name])


def logged(c: Cluster, reason: str) -> bool:
    """Whether the engine logged a refused load for ``reason``."""
    log = (c.log_dir / "engine0.log").read_text()
    return any("drafter load refused" in line and reason in line for line in log.splitlines())


@pytest.mark.parametrize("name", ["block-1e9", "layers-1e6", "nan", "truncated", "rope-list", "wide"])
def test_a_hostile_drafter_given_at_start_stops_the_engine_saying_why(
    tiny_model: Path, drafters: Path, name: str
) -> None:
    """openinfer-engine --draft-model HOSTILE exits 2 at load, its log naming the value."""
    result = subprocess.run(
        [sys.executable, "-m", "openinfer.engine_core.process.engine_cli", "--device", "cpu",
         "--model", str(tiny_model), "--draft-model", str(drafters / name), "--kv-cache-gb", "0.05",
         "--frontend", "tcp://127.0.0.1:1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert HOSTILE[name] in result.stderr
