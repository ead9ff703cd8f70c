"""How long `/health` takes while one huge prompt is in flight: no request may stall the others (issue 15).

Starts a frontend and one engine, sends one completion whose prompt is ``--prompt-mb`` megabytes of distinct
random words (the tokenizer's word cache cannot make them cheap), and polls `/health` every 10 ms from the
moment the prompt is sent until it is answered. Engines:

- default: a ``--fake-model`` engine (the built-in 512-token vocabulary, 2048 positions): a prompt of more
  than 2048 x 13 characters cannot fit, whatever its tokens;
- ``--real-vocab``: a one-layer random model of Qwen3's real vocabulary (longest token 128 characters) with
  40960 positions: up to 5.2 M characters fit that bound, so such a prompt is tokenized before its token
  count refuses it.

    python -m openinfer.benchmarks.health_during_prompt --prompt-mb 10.5
    python -m openinfer.benchmarks.health_during_prompt --prompt-mb 5 --real-vocab
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import string
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from openinfer.benchmarks.cluster_flags import LOAD_ENGINE, QUIET
from openinfer.engine_core.launch.local_cluster import LocalCluster

# A Qwen3-vocabulary model small enough to build and load in seconds (its widths are not Qwen3's).
_REAL_VOCAB_WIDTHS = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}


def random_words(num_chars: int, seed: int = 0) -> str:
    """``num_chars`` characters of distinct random lowercase words."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < num_chars:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8)))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:num_chars]


async def post_while_polling_health(
    url: str, path: str, body: dict[str, Any], interval: float = 0.01
) -> tuple[int, Any, float, list[float]]:
    """POST ``body`` to ``url + path`` once, polling /health every ``interval`` seconds from the moment it is
    sent until it is answered: (its status, its JSON, seconds it took, each /health's latency). A /health
    other than 200 is an error."""
    latencies: list[float] = []
    done = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def poll() -> None:
            while not done.is_set():
                started = time.monotonic()
                async with session.get(f"{url}/health") as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"/health answered {r.status} while the prompt was in flight")
                latencies.append(time.monotonic() - started)
                await asyncio.sleep(interval)

        poller = asyncio.create_task(poll())
        await asyncio.sleep(0)  # the first poll is in flight with the request
        started = time.monotonic()
        try:
            async with session.post(f"{url}{path}", json=body) as r:
                status, answer = r.status, await r.json()
            took = time.monotonic() - started
        finally:
            done.set()
            await poller
    return status, answer, took, latencies


async def measure(url: str, model: str, prompt: str) -> dict[str, object]:
    """Send the prompt once and poll /health meanwhile: the prompt's status and seconds, /health's latency."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1}
    status, answer, took, latencies = await post_while_polling_health(url, "/v1/completions", body)
    message = answer.get("error", {}).get("message", "") if isinstance(answer, dict) else ""
    return {
        "prompt_chars": len(prompt),
        "status": status,
        "prompt_s": round(took, 3),
        "health_polls": len(latencies),
        "health_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "health_max_ms": round(max(latencies) * 1000, 1),
        "answer": message[:160],
    }


def real_vocab_model(folder: Path) -> Path:
    # imported here: only this engine needs torch in the benchmark's own process
    import torch

    from openinfer.engine_core.testing.qwen3_checkpoint import make_qwen3_0_6b_shaped_checkpoint

    return make_qwen3_0_6b_shaped_checkpoint(
        folder, num_hidden_layers=1, max_position_embeddings=40960, dtype=torch.float32, num_shards=1,
        widths=_REAL_VOCAB_WIDTHS,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--prompt-mb", type=float, default=10.5, help="prompt size in millions of characters")
    parser.add_argument("--real-vocab", action="store_true", help="Qwen3's vocabulary, 40960 positions")
    args = parser.parse_args()
    prompt = random_words(int(args.prompt_mb * 1_000_000))
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp) / "logs")
        try:
            cluster.start_frontend(*QUIET)
            if args.real_vocab:
                model = real_vocab_model(Path(tmp) / "model")
                cluster.start_engine(model, 0, "--served-model-name", "real-vocab", "--kv-cache-gb", "0.05")
                name = "real-vocab"
            else:
                cluster.start_fake_engine(0, *LOAD_ENGINE)
                name = "fake"
            cluster.wait_healthy(120.0, engines=1)
            print(json.dumps(asyncio.run(measure(cluster.url, name, prompt))))
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
