"""Reading Hugging Face safetensors checkpoints (one file or sharded with an index)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from safetensors import safe_open
from torch import Tensor


def iter_safetensors(folder: Path) -> Iterator[tuple[str, Tensor]]:
    """Every (name, tensor) of the folder's model.safetensors, or of the shards its index names."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{folder} holds neither model.safetensors nor model.safetensors.index.json")
    for file in files:
        with safe_open(str(folder / file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
