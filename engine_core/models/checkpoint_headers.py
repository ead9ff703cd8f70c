"""A checkpoint's tensors as its safetensors headers describe them (names, shapes, dtypes; no tensor data),
checked against the shapes a config implies before any parameter is allocated or any tensor read.

The loader (``weights.load_checkpoint``) compares each tensor's shape as it reaches it, so a checkpoint
whose config and weights disagree could make it read gigabytes of the tensors before first; this check reads
only the headers and refuses such a checkpoint with the loader's own messages. The files are the loader's too, opened
as it opens them (``weights.read_headers``): regular files inside the
folder, a truncated file or a header too large a ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from openinfer.engine_core.models.weights import read_headers

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})  # safetensors' names of the dtypes a weight may have


def check_headers(
    folder: Path,
    expected: Mapping[str, tuple[int, ...]],
    *,
    unexpected_hint: str,
    optional: Mapping[str, tuple[int, ...]] | None = None,
    shape_problem: Callable[[str, tuple[int, ...]], str | None] = lambda name, shape: None,
    files: Sequence[str] | None = None,
) -> None:
    """Refuse the folder's checkpoint unless its tensors are exactly ``expected`` (name -> shape), and any of
    ``optional`` (tensors the loader skips, of that shape), each in a floating-point dtype. The messages are
    ``load_checkpoint``'s (``unexpected_hint``, ``shape_problem``); ``files``: those of the folder, not its
    checkpoint's."""
    headers, allowed = read_headers(folder, files), {**(optional or {}), **expected}
    for name, header in headers.items():
        shape = allowed.get(name)
        if shape is None:
            raise ValueError(f"{folder}: unexpected tensor {name!r}{unexpected_hint}")
        if header.shape != shape:
            problem = shape_problem(name, header.shape)
            if problem is None:
                problem = f"tensor {name!r} has shape {header.shape}, the config says {shape}"
            raise ValueError(f"{folder}: {problem}")
        if header.dtype not in FLOAT_DTYPES:
            raise ValueError(
                f"{folder}: tensor {name!r} is {header.dtype}; weights are one of {sorted(FLOAT_DTYPES)}"
            )
    missing = sorted(expected.keys() - headers.keys())
    if missing:
        raise ValueError(f"{folder}: {len(missing)} tensors missing from the checkpoint, e.g. {missing[:3]}")
