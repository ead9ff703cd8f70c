"""Reading Hugging Face safetensors checkpoints (one file or sharded with an index)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from openinfer.engine_core.models.model_folder import model_file

INDEX = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 * 2**20  # an index naming 100,000 tensors takes ~10 MB


def checkpoint_files(folder: Path) -> list[Path]:
    """The folder's model.safetensors, or the shards its model.safetensors.index.json names. Each is a regular
    file inside the folder (see `model_file`): ValueError naming it otherwise."""
    if os.path.lexists(folder / INDEX):
        index = model_file(folder, INDEX)
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise ValueError(f"{index}: {index.stat().st_size} bytes, more than an index can need")
        try:
            weight_map = json.loads(index.read_bytes())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(
                f"{index} is not a safetensors index (no weight_map of names to files: {e!r})"
            ) from e
        if not all(isinstance(file, str) for file in files):
            raise ValueError(f"{index}: its weight_map must map tensor names to file names")
        return [model_file(folder, file) for file in files]
    if os.path.lexists(folder / "model.safetensors"):
        return [model_file(folder, "model.safetensors")]
    raise FileNotFoundError(f"{folder} holds neither model.safetensors nor {INDEX}")


def _files(folder: Path, files: Sequence[str] | None) -> list[Path]:
    """``files`` of the folder (each a regular file inside it), or its checkpoint's when None."""
    return checkpoint_files(folder) if files is None else [model_file(folder, name) for name in files]


@contextmanager
def open_safetensors(file: Path) -> Iterator[Any]:
    """safe_open(file) on the CPU, its errors (a truncated file, a header too large or that does not match
    the file's size, offsets past its end) ValueErrors naming the file."""
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            yield f
    except SafetensorError as e:
        raise ValueError(f"{file} is not a valid safetensors file ({e}); download it again") from e


def iter_safetensors(folder: Path) -> Iterator[tuple[str, Tensor]]:
    """Every (name, tensor) of the folder's model.safetensors, or of the shards its index names."""
    for file in checkpoint_files(folder):
        with open_safetensors(file) as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


@dataclass(frozen=True)
class CheckpointSlice:
    """Where a rank's slice of a checkpoint tensor goes: ``target`` receives ``tensor[index]`` of the
    checkpoint's tensor of ``full_shape``, read alone from the file (safetensors' ``get_slice``)."""

    target: Tensor  # the parameter, or a view of part of one, in the slice's shape
    full_shape: tuple[int, ...]  # the whole tensor's shape in the checkpoint (what config.json implies)
    index: tuple[slice, ...]  # the slice, one per leading dimension


# A checkpoint tensor's destination: a tensor that takes it whole, a rank's slice of it, or several slices
# of it (each into its own view: a Gated DeltaNet rank's q, k and v rows of the packed in_proj_qkv).
Target = Tensor | CheckpointSlice | tuple[CheckpointSlice, ...]


def load_checkpoint(
    folder: Path,
    targets: Mapping[str, Target],
    *,
    unexpected_hint: str,
    skip: Callable[[str], bool] = lambda name: False,
    shape_problem: Callable[[str, tuple[int, ...]], str | None] = lambda name, shape: None,
    files: Sequence[str] | None = None,
) -> None:
    """Copy every tensor of `folder`'s safetensors (or of its `files`) into the target of the same name (a
    parameter, or a view of part of one), or only the slice a `CheckpointSlice` (or each of several) names
    (the rest is never read). A tensor with no target (unless `skip` says so; a skipped tensor is not read),
    one whose shape (read from its header, before its data) is not its target's whole shape, or a target
    that no tensor fills is an error naming `folder`. `unexpected_hint` follows the unexpected tensor's name;
    `shape_problem` may explain a misshapen tensor better than the shapes alone."""
    loaded: set[str] = set()
    for file in _files(folder, files):
        with open_safetensors(file) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                if skip(name):
                    continue
                target = targets.get(name)
                if target is None:
                    raise ValueError(f"{folder}: unexpected tensor {name!r}{unexpected_hint}")
                part = f.get_slice(name)
                shape = tuple(part.get_shape())
                slices: tuple[CheckpointSlice, ...] = ()  # a sliced target's slices (a tensor: none)
                if isinstance(target, Tensor):
                    expected = tuple(target.shape)
                else:
                    slices = (target,) if isinstance(target, CheckpointSlice) else target
                    expected = slices[0].full_shape
                if shape != expected:
                    problem = shape_problem(name, shape)
                    if problem is None:
                        problem = f"tensor {name!r} has shape {shape}, the config says {expected}"
                    raise ValueError(f"{folder}: {problem}")
                with torch.no_grad():
                    if isinstance(target, Tensor):
                        _copy_in_memory_order(target, f.get_tensor(name))
                    else:
                        for piece in slices:
                            _copy_in_memory_order(piece.target, part[piece.index])
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


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as its file's header describes it."""

    shape: tuple[int, ...]
    dtype: str  # safetensors' name: F32, BF16, ...


def read_headers(folder: Path, files: Sequence[str] | None = None) -> dict[str, TensorHeader]:
    """Every tensor of the folder's safetensors files (those ``checkpoint_files`` names, or the ``files`` of
    the folder named), from their headers; ValueError naming a file that is not a valid safetensors file."""
    headers = {}
    for file in _files(folder, files):
        with open_safetensors(file) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                part = f.get_slice(name)
                headers[name] = TensorHeader(tuple(part.get_shape()), part.get_dtype())
    return headers


def checkpoint_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor in the folder's safetensors, by name (read from the headers, no tensor data)."""
    return {name: header.shape for name, header in read_headers(folder).items()}


def checkpoint_names(folder: Path) -> list[str]:
    """The names of every tensor in the folder's safetensors (read from the headers, no tensor data)."""
    return list(checkpoint_shapes(folder))


def check_fits_checkpoint(model: nn.Module, folder: Path) -> None:
    """Refuse, before its parameters are allocated (`model` may be on the meta device), a model whose
    config.json asks for more parameters than the folder's safetensors hold: no load could fill it."""
    needed = sum(p.numel() for p in model.parameters())
    held = sum(math.prod(shape) for shape in checkpoint_shapes(folder).values())
    if needed > held:
        raise ValueError(
            f"{folder}: config.json's sizes make a model of {needed:,} parameters, but its safetensors hold "
            f"{held:,} values; config.json does not describe these weights"
        )
