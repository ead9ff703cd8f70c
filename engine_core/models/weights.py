"""Reading Hugging Face safetensors checkpoints (one file or sharded with an index)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor


def checkpoint_files(folder: Path) -> list[Path]:
    """The folder's model.safetensors, or the shards its model.safetensors.index.json names."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / file for file in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    raise FileNotFoundError(f"{folder} holds neither model.safetensors nor model.safetensors.index.json")


def iter_safetensors(folder: Path) -> Iterator[tuple[str, Tensor]]:
    """Every (name, tensor) of the folder's model.safetensors, or of the shards its index names."""
    for file in checkpoint_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_checkpoint(
    folder: Path,
    targets: Mapping[str, Tensor],
    *,
    unexpected_hint: str,
    skip: Callable[[str], bool] = lambda name: False,
    shape_problem: Callable[[str, tuple[int, ...]], str | None] = lambda name, shape: None,
) -> None:
    """Copy every tensor of `folder`'s safetensors into the target tensor of the same name (a parameter, or a
    view of part of one). A tensor with no target (unless `skip` says so), a misshapen one, or a target that
    no tensor fills is an error naming `folder`. `unexpected_hint` follows the unexpected tensor's name;
    `shape_problem` may explain a misshapen tensor better than the shapes alone."""
    loaded: set[str] = set()
    for name, tensor in iter_safetensors(folder):
        if skip(name):
            continue
        target = targets.get(name)
        if target is None:
            raise ValueError(f"{folder}: unexpected tensor {name!r}{unexpected_hint}")
        if target.shape != tensor.shape:
            shape = tuple(tensor.shape)
            problem = shape_problem(name, shape)
            if problem is None:
                problem = f"tensor {name!r} has shape {shape}, the config says {tuple(target.shape)}"
            raise ValueError(f"{folder}: {problem}")
        with torch.no_grad():
            _copy_in_memory_order(target, tensor)
        loaded.add(name)
    missing = sorted(targets.keys() - loaded)
    if missing:
        raise ValueError(f"{folder}: {len(missing)} tensors missing from the checkpoint, e.g. {missing[:3]}")


def _copy_in_memory_order(target: Tensor, tensor: Tensor) -> None:
    """target[...] = tensor, written in the target's memory order: a transposed view (a packed or transposed
    parameter's, stride 1 along dim 0) is filled through its contiguous transpose, which on the CPU reads
    the checkpoint's rows strided instead of scattering the writes (4x faster for a 151,936-row head)."""
    if target.dim() == 2 and target.stride(0) == 1 and target.shape[0] > 1:
        target.t().copy_(tensor.t())
    else:
        target.copy_(tensor)


def checkpoint_names(folder: Path) -> list[str]:
    """The names of every tensor in the folder's safetensors (read from the headers, no tensor data)."""
    names: list[str] = []
    for file in checkpoint_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            names.extend(f.keys())
    return names
