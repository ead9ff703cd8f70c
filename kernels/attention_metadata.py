"""The per-step metadata every paged-attention backend reads: `AttentionMetadata` (where a step's new tokens go
in the KV cache and what each attends to) and the runs of consecutive blocks the CPU path reads in place.

KV cache layout, one tensor per layer: (2, num_blocks, block_size, num_kv_heads, head_dim), index 0 keys and
1 values. Token position p of a request lives in slot block_table[p // block_size] * block_size
+ p % block_size. The cache must start zeroed: the padded reference reads padding slots (masked out, but a NaN
there would still poison the weighted sum).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import NDArray
from torch import Tensor

from openinfer.kernels.host_copy import host_to_device, host_to_device_parts

if TYPE_CHECKING:
    from openinfer.kernels.state_index import StateIndex


class BlockRun(NamedTuple):
    """Blocks table[offset : offset + length] of a request's block table, whose ids are first .. first +
    length - 1."""

    offset: int
    first: int
    length: int


@dataclass(frozen=True)
class AttentionMetadata:
    """Where one step's new tokens go in the paged KV cache and what each of them attends to.

    The step's tokens are packed back to back, request after request (B requests). Built once per step and
    shared by every layer; the derived index tensors below are computed on first use, then reused.
    """

    slot_mapping: Tensor  # (num_tokens,) int64: cache slot of each new token
    query_start_loc: Tensor  # (B + 1,) int32: request b's tokens are [loc[b], loc[b + 1])
    seq_lens: Tensor  # (B,) int32: context length after this step, the new tokens included
    block_tables: Tensor  # (B, max_blocks) int32, rows padded with block 0
    query_lens: list[int]  # new tokens per request
    context_lens: list[int]  # tokens already in the cache before this step, per request
    max_query_len: int
    max_seq_len: int
    block_size: int
    # per request, the runs of consecutive block ids holding its keys, in table order (the CPU path reads a
    # long run as a view of the cache); found on the host for CPU steps, None on other devices
    block_runs: list[list[BlockRun]] | None
    # a hybrid model's step: the state slots its Gated DeltaNet layers read and write (None otherwise)
    states: StateIndex | None = None

    @classmethod
    def build(
        cls,
        context_lens: list[int],
        query_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device,
    ) -> AttentionMetadata:
        """Metadata for requests that each hold context_lens[b] cached tokens and add query_lens[b] new
        ones; block_tables[b] must cover their sum."""
        width = max(len(table) for table in block_tables)
        tables = np.array([table + [0] * (width - len(table)) for table in block_tables], dtype=np.int64)
        slots = [
            table[p // block_size] * block_size + p % block_size
            for table, c, q in zip(block_tables, context_lens, query_lens, strict=True)
            for p in range(c, c + q)
        ]
        return cls.from_arrays(
            np.array(context_lens, dtype=np.int64),
            np.array(query_lens, dtype=np.int64),
            tables,
            host_to_device(slots, torch.int64, device),
            block_size,
            max(query_lens),
            max(c + q for c, q in zip(context_lens, query_lens, strict=True)),
        )

    @classmethod
    def from_arrays(
        cls,
        context_lens: NDArray[np.int64],
        query_lens: NDArray[np.int64],
        block_tables: NDArray[np.int64],
        slot_mapping: Tensor,
        block_size: int,
        max_query_len: int,
        max_seq_len: int,
    ) -> AttentionMetadata:
        """The metadata of (B,) context and query lengths (their longest query and context given) and
        (B, W) padded block tables, with the step's slot mapping already on its device: the int32 fields in
        one host-to-device copy."""
        num_reqs, width = block_tables.shape
        packed = np.empty(2 * num_reqs + 1 + num_reqs * width, dtype=np.int32)
        packed[0] = 0
        np.cumsum(query_lens, out=packed[1 : num_reqs + 1])
        seq_lens = packed[num_reqs + 1 : 2 * num_reqs + 1]
        np.add(context_lens, query_lens, out=seq_lens)
        packed[2 * num_reqs + 1 :] = block_tables.ravel()
        query_start_loc, seq_lens_tensor, tables = host_to_device_parts(
            packed, [num_reqs + 1, num_reqs, num_reqs * width], slot_mapping.device
        )
        return cls(
            slot_mapping=slot_mapping,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens_tensor,
            block_tables=tables.view(num_reqs, width),
            query_lens=query_lens.tolist(),
            context_lens=context_lens.tolist(),
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            block_size=block_size,
            block_runs=(
                find_block_runs(block_tables, context_lens + query_lens, block_size)
                if slot_mapping.device.type == "cpu"
                else None
            ),
        )

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @cached_property
    def padded_query_index(self) -> Tensor:
        """(num_tokens,) int64: row of each packed token in a (B * max_query_len) padded layout."""
        device = self.query_start_loc.device
        num_reqs = len(self.query_lens)
        query_lens = self.query_start_loc.diff()  # (B,)
        batch = torch.repeat_interleave(
            torch.arange(num_reqs, device=device), query_lens, output_size=self.num_tokens
        )  # (num_tokens,) request of each token
        offset = torch.arange(self.num_tokens, device=device) - self.query_start_loc[batch]
        return batch * self.max_query_len + offset

    @cached_property
    def causal_mask(self) -> Tensor:
        """(B, max_query_len, max_seq_len) bool: key j is visible to query i of request b iff
        j <= context_lens[b] + i (its position) and j < seq_lens[b]."""
        device = self.seq_lens.device
        context = (self.seq_lens - self.query_start_loc.diff()).long()  # (B,)
        query_pos = context[:, None] + torch.arange(self.max_query_len, device=device)  # (B, Q)
        key_pos = torch.arange(self.max_seq_len, device=device)  # (S,)
        visible = key_pos[None, None, :] <= query_pos[:, :, None]  # (B, Q, S)
        return visible & (key_pos[None, None, :] < self.seq_lens[:, None, None])

    @cached_property
    def queries_are_padded(self) -> bool:
        """Whether the packed tokens differ from the (B * max_query_len) padded layout, i.e. query lengths
        differ; an all-decode step (every length 1) or a lone request's chunk needs no padding."""
        return self.num_tokens != len(self.query_lens) * self.max_query_len

    @cached_property
    def attn_bias(self) -> Tensor | None:
        """(B, 1, max_query_len, max_seq_len) float32: 0 where `causal_mask` lets a query see a key, -inf
        elsewhere; None when every query sees every key (decodes over equally long contexts)."""
        if self.max_query_len == 1 and min(self.context_lens) + 1 == self.max_seq_len:
            return None
        bias = torch.zeros(self.causal_mask.shape, dtype=torch.float32, device=self.seq_lens.device)
        return bias.masked_fill_(~self.causal_mask, float("-inf"))[:, None]

    @cached_property
    def padded_key_slots(self) -> Tensor:
        """(B * max_seq_len,) int64: cache slot of key j of request b at row b * max_seq_len + j. Rows past
        seq_lens[b] point at whatever slot the padded block table gives (masked out, never written)."""
        device = self.block_tables.device
        key_pos = torch.arange(self.max_seq_len, device=device)  # (S,)
        blocks = self.block_tables[:, key_pos // self.block_size].long()  # (B, S)
        return (blocks * self.block_size + key_pos % self.block_size).flatten()

    @cached_property
    def cu_seqlens_k(self) -> Tensor:
        """(B + 1,) int32: request b's keys are [cu_seqlens_k[b], cu_seqlens_k[b+1]) when packed."""
        return F.pad(self.seq_lens.cumsum(0, dtype=torch.int32), (1, 0))


def find_block_runs(
    block_tables: NDArray[np.int64], seq_lens: NDArray[np.int64], block_size: int
) -> list[list[BlockRun]]:
    """`AttentionMetadata.block_runs` from the (B, W) host block tables and (B,) sequence lengths."""
    used = -(-seq_lens // block_size)  # (B,) blocks holding each request's keys
    breaks = np.diff(block_tables, axis=1) != 1  # (B, W - 1): block j + 1 does not follow block j
    runs = []
    for table, n, row_breaks in zip(block_tables, used.tolist(), breaks, strict=True):
        starts = [0, *(np.flatnonzero(row_breaks[: n - 1]) + 1).tolist()]
        ends = [*starts[1:], n]
        runs.append([BlockRun(s, int(table[s]), e - s) for s, e in zip(starts, ends, strict=True)])
    return runs
