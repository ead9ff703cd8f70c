"""Host lists and arrays copied to the step's device without waiting for it: every step's index tensors (token
ids, positions, slots, sampling parameters, draft ids) cross here."""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor


def host_to_device(
    values: list[int] | list[float] | NDArray[np.int64], dtype: torch.dtype, device: torch.device
) -> Tensor:
    """``values`` as a tensor on ``device``, copied without waiting for the device (from pinned memory)."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def host_to_device_parts(packed: NDArray[Any], sizes: list[int], device: torch.device) -> list[Tensor]:
    """``packed`` cut into consecutive parts of ``sizes`` elements, as tensors on ``device``: views of the
    array on the CPU (no copy), views of one pinned non-blocking copy on CUDA."""
    if device.type == "cpu":
        bounds = [0, *accumulate(sizes)]
        return [torch.from_numpy(packed[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    return list(torch.from_numpy(packed).pin_memory().to(device, non_blocking=True).split_with_sizes(sizes))
