"""The step's one device-to-host read-back: every device tensor the host needs after a step, copied together."""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import torch
from torch import Tensor


class ReadBack:
    """Collects a step's device tensors (``add``) and copies them to the host in one ``tolist`` (``read``).

    On CUDA each read-back waits for the device (a host sync), so a step pays it once, whatever it holds:
    tokens, accepted counts, logprobs, draft ids. The parts are flattened and concatenated, as int64 when
    they all are integers, else as float64 (it holds every token id and every float32 logprob exactly).
    """

    def __init__(self) -> None:
        self._parts: list[Tensor] = []
        self._values: list[list[Any]] = []

    def add(self, tensor: Tensor) -> int:
        """Queue ``tensor`` (any shape); after ``read``, ``ints``/``floats`` of this index give its values."""
        self._parts.append(tensor.flatten())
        return len(self._parts) - 1

    def read(self) -> None:
        """Copy every queued tensor to the host: one device-to-host copy for all of them."""
        parts = self._parts
        if len(parts) <= 1:
            self._values = [p.tolist() for p in parts]
            return
        floating = any(p.is_floating_point() for p in parts)
        values = torch.cat([p.double() for p in parts] if floating else parts).tolist()  # the one copy
        bounds = [0, *accumulate(p.numel() for p in parts)]
        self._values = [values[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]

    def ints(self, index: int) -> list[int]:
        """The values of the integer tensor queued at ``index``, flat (exact: token ids are below 2**53)."""
        values = self._values[index]
        return values if not values or isinstance(values[0], int) else [int(v) for v in values]

    def floats(self, index: int) -> list[float]:
        """The values of the floating tensor queued at ``index``, flat."""
        return self._values[index]
