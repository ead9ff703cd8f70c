"""The attention backends' names (``--attention-backend``), importable without torch: the launcher and the
engine's config read them."""

from __future__ import annotations

import enum


class BackendName(enum.StrEnum):
    """``--attention-backend``: auto is triton on CUDA and torch on the CPU."""

    AUTO = "auto"
    TORCH = "torch"
    TRITON = "triton"
    FLASH_ATTN = "flash_attn"
