"""Counting what a checkpoint load reads (tests of tensor-parallel loading): `ReadCounter.open` stands in for
weights.safe_open (monkeypatched) and counts the values read, and the names read whole."""

from __future__ import annotations

from typing import Any

import torch

from openinfer.engine_core.models import weights


class ReadCounter:
    """Wraps safetensors' safe_open to count the values read, and the names read whole."""

    def __init__(self) -> None:
        self.values = 0
        self.whole: list[str] = []
        self.safe_open = weights.safe_open

    def open(self, *args: Any, **kwargs: Any) -> Any:
        counter, handle = self, self.safe_open(*args, **kwargs)

        class Counted:
            def __enter__(self) -> Counted:
                self.f = handle.__enter__()
                return self

            def __exit__(self, *exc: object) -> None:
                handle.__exit__(*exc)

            def __getattr__(self, name: str) -> Any:  # keys, metadata
                return getattr(self.f, name)

            def get_tensor(self, name: str) -> torch.Tensor:
                counter.whole.append(name)
                tensor = self.f.get_tensor(name)
                counter.values += tensor.numel()
                return tensor

            def get_slice(self, name: str) -> Any:
                return CountedSlice(self.f.get_slice(name))

        class CountedSlice:
            def __init__(self, part: Any) -> None:
                self.part = part

            def __getattr__(self, name: str) -> Any:  # get_shape, get_dtype
                return getattr(self.part, name)

            def __getitem__(self, index: Any) -> torch.Tensor:
                tensor = self.part[index]
                counter.values += tensor.numel()
                return tensor

        return Counted()
