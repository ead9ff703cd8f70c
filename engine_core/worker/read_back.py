"""The step's one device-to-host read-back: every device tensor the host needs after a step, copied together."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import torch
from torch import Tensor


def read_back(parts: Sequence[Tensor | None]) -> list[list[Any] | None]:
    """Each part's values, flat (None stays None), copied to the host in one ``tolist``.

    On CUDA each read-back waits for the device (a host sync), so a step pays it once, whatever it holds:
    tokens, accepted counts, logprobs, draft ids. The parts are flattened and concatenated, as int64 when
    they all are integers, else as float64 (it holds every token id and every float32 logprob exactly); an
    integer part comes back as ints either way.
    """
    present = [part.flatten() for part in parts if part is not None]
    floating = any(part.is_floating_point() for part in present)
    if len(present) <= 1:
        values = [part.tolist() for part in present]
    else:
        flat = torch.cat([p.double() for p in present] if floating else present).tolist()  # the one copy
        bounds = [0, *accumulate(p.numel() for p in present)]
        values = [flat[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    read = iter(zip(present, values, strict=True))
    out: list[list[Any] | None] = []
    for part in parts:
        if part is None:
            out.append(None)
            continue
        tensor, part_values = next(read)
        if floating and not tensor.is_floating_point():
            part_values = [int(v) for v in part_values]
        out.append(part_values)
    return out
