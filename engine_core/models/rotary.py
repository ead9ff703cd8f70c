"""Rotary position embeddings (RoPE) in transformers' rotate_half layout, shared by the Qwen3, Qwen3.5 and
DFlash models."""

from __future__ import annotations

import torch
from torch import Tensor


class RotaryEmbedding:
    """RoPE tables for the given positions, in transformers' rotate_half layout (two halves, not pairs).

    With `max_positions`, the cos/sin of every position below it are computed once (on first use, for the
    device and dtype asked for, which every later call must match; max_positions * head_dim * 2 values) and
    each call is one row lookup;
    without, each call computes its own. Both give transformers' float32 values, cast to the dtype.
    """

    def __init__(self, head_dim: int, theta: float, max_positions: int | None = None) -> None:
        # Computed once on the CPU, like transformers, so every device starts from the same frequencies.
        self.inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim)
        )
        self.max_positions = max_positions
        self._table: Tensor | None = None  # (max_positions, 2, head_dim): cos, sin of every position

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions (num_tokens,) int64 -> cos, sin, each (num_tokens, head_dim)."""
        if self.max_positions is None:
            cos_sin = self._compute(positions).to(dtype)
        else:
            table = self._table
            if table is None:  # built once: a CUDA graph captured over it reads it on every replay
                all_positions = torch.arange(self.max_positions, device=positions.device)
                table = self._table = self._compute(all_positions).to(dtype)
            elif table.device != positions.device or table.dtype != dtype:
                raise ValueError(
                    f"the RoPE table is {table.dtype} on {table.device}; asked for {dtype} on {positions.device}"
                )
            cos_sin = table.index_select(0, positions)  # (num_tokens, 2, head_dim)
        return cos_sin[:, 0], cos_sin[:, 1]

    def _compute(self, positions: Tensor) -> Tensor:
        """(num_tokens,) -> (num_tokens, 2, head_dim) float32: cos, sin."""
        inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * inv_freq[None, :]  # (num_tokens, head_dim // 2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (num_tokens, head_dim)
        return torch.stack((emb.cos(), emb.sin()), dim=1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (num_tokens, heads, head_dim); cos/sin (num_tokens, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
