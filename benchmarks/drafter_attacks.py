"""Issue 39's hostile drafters (item 3): DSpark folders a client of the admin API names for a run-time load.

Each is the built-in DSpark drafter made hostile in one way: a block of 1e9 slots, 10^6 draft layers (as
JSON's float 1e6 and as the integer), NaN or infinite weights, a config the weights do not match. The
engine must refuse each quickly (400) and go on drafting with the drafter it had. Last, a drafter whose
weights are finite but overflow in its first matmul (every fc weight 3e38) loads (200), and completions
drafted by it must still succeed. Its server gets the admin
key and the folder the drafters are written into as the allowed one (``attackers.SERVE_FLAGS``):

    python -m openinfer.benchmarks.attacks --attacks hostile_drafters
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from safetensors.torch import load_file, save_file

from openinfer.benchmarks.attack_target import ADMIN_HEADERS, Target, post, tally
from openinfer.engine_core.builtin_model import builtin_drafter_folder

HOSTILE_DRAFTER_DIR = Path(tempfile.gettempdir()) / "openinfer-hostile-drafters"  # --allowed-drafter-dir
K = 7  # the built-in DSpark drafter's block: the drafter the engine must keep
LOAD_TIMEOUT_S = 20.0  # each load's wait: a refusal takes well under a second
# name -> the config keys it sets; the weight attacks set no key. Hangs late: a server that loads one of
# them may stop answering the ones after; the overflowing drafter, which loads, last.
_CONFIG_ATTACKS: dict[str, dict[str, Any]] = {
    "nan_weights": {},
    "inf_weights": {},
    "weights_unlike_config": {"intermediate_size": 512},  # the weights are 768 wide
    "layers_1e6_float": {"num_hidden_layers": 1e6},
    "layers_1e6": {"num_hidden_layers": 10**6},
    "block_1e9": {"block_size": 1e9},
    "overflowing_weights": {},  # loads: what it drafts must never fail a request
}


def write_hostile_drafters(root: Path) -> dict[str, Path]:
    """Each hostile copy of the built-in DSpark drafter under ``root`` (rewritten), by name."""
    shutil.rmtree(root, ignore_errors=True)
    folders = {}
    for name, config in _CONFIG_ATTACKS.items():
        folder = Path(shutil.copytree(builtin_drafter_folder("dspark"), root / name))
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
        if name.endswith("_weights"):
            weights = load_file(folder / "model.safetensors")
            if name == "overflowing_weights":  # finite in float32 (max ~3.4e38): NaN hidden states
                weights["fc.weight"].fill_(3e38)
            else:
                weights["fc.weight"][0, 0] = float("nan") if name == "nan_weights" else float("inf")
            save_file(weights, str(folder / "model.safetensors"))
        folders[name] = folder
    return folders


async def load(target: Target, body: dict[str, Any]) -> tuple[int, str]:
    """POST a drafter load to engine 0: its status (0: no answer within LOAD_TIMEOUT_S) and message."""
    limit = aiohttp.ClientTimeout(total=LOAD_TIMEOUT_S)
    try:
        async with target.session.post(
            f"{target.url}/admin/engines/0/drafter", json=body, timeout=limit, headers=ADMIN_HEADERS
        ) as r:
            answer = await r.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return 0, "no answer"
    message = answer.get("message") or answer.get("error", {}).get("message", "")
    return r.status, str(message)


async def hostile_drafters(target: Target) -> str:
    """Load the built-in DSpark drafter (K = 7), then each hostile folder: their statuses and the longest
    wait, then engine 0's K and a completion's status."""
    folders = await asyncio.to_thread(write_hostile_drafters, HOSTILE_DRAFTER_DIR)
    status, message = await load(target, {"method": "dspark", "num_spec_tokens": K})
    if status != 200:
        return f"the built-in DSpark drafter did not load ({status}: {message})"
    answers, slowest = [], 0.0
    for name, folder in folders.items():
        started = time.monotonic()
        body = {"method": "dspark", "num_spec_tokens": K, "draft_model": str(folder)}
        status, message = await load(target, body)
        slowest = max(slowest, time.monotonic() - started)
        answers.append(f"{name} {status or 'no answer'}")
        if "--allowed-drafter-dir" in message:
            return f"{name}: {message}; serve with --allowed-drafter-dir={HOSTILE_DRAFTER_DIR}"
    async with target.session.get(f"{target.url}/admin/engines", headers=ADMIN_HEADERS) as r:
        engines = await r.json() if r.status == 200 else {"engines": []}
    k = next((e["num_spec_tokens"] for e in engines["engines"] if e["index"] == 0), None)
    completions = [await post(target, target.body(max_tokens=32), timeout=LOAD_TIMEOUT_S) for _ in range(4)]
    return (
        f"loads: {', '.join(answers)} (slowest {slowest:.1f} s); engine 0 K={k} afterwards "
        f"(was {K}); completions drafted by the overflowing drafter: {tally(completions)}"
    )
