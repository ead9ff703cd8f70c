"""Which state slots a step of a hybrid model's Gated DeltaNet layers reads and writes (`StateIndex`), shared by
every implementation of `causal_conv1d` and `gated_delta_rule` (torch, Triton, fla), and the step shape that
splits their two forms.

Slot -1 means "none": a read slot of -1 starts the request from zeros, a write slot of -1 stores nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Steps whose longest request has at most this many tokens run the batched recurrent form (decode q=1,
# verification q<=16: the form the CUDA graphs capture); longer steps run per request, chunked past this length.
RECURRENT_MAX_QUERY_LEN = 16


@dataclass(frozen=True)
class StateIndex:
    """Which state slot each request of a step starts from and where each token's state goes.

    Slot -1 means "none": a read slot of -1 starts the request from zeros (its position 0), a write slot of -1
    stores nothing for that token. The padded-grid tensors are derived from query_start_loc by `build`.
    """

    query_start_loc: list[int]  # (B + 1,) host ints: request b's tokens are [loc[b], loc[b+1]) of the step
    read_slots: Tensor  # (B,) int64 on the device: slot holding the state before request b's first token
    write_slots: Tensor  # (N,) int64 on the device: slot to store the state *after* token t
    host_write_slots: list[int]  # write_slots on the host: the long path stores only the tokens that have one
    # Host facts about the slots, for the torch forms, set only for a step built for the CPU (`build`; the CUDA
    # kernels read neither): whether some read
    # slot is -1 (a gathered state is zero-filled only then), and for a decode whose requests each read and
    # write one slot of their own, together a block of consecutive slots, that block's first slot and the
    # requests in slot order (the CPU then updates the block in place); None for any other step.
    zero_reads: bool
    own_block: tuple[int, list[int]] | None
    max_query_len: int  # L, the longest request's token count
    padded_tokens: Tensor  # (B, L) int64: token of request b's position i; its first token where i >= len
    padded_write_slots: Tensor  # (B, L) int64: write slot of (b, i), -1 at padded positions
    token_positions: Tensor  # (N,) int64: b * L + i for token t, its place on the flattened grid

    @classmethod
    def build(
        cls, query_start_loc: list[int], read_slots: list[int], write_slots: list[int], device: torch.device
    ) -> StateIndex:
        num_requests, num_tokens = len(query_start_loc) - 1, query_start_loc[-1]
        if num_requests < 1 or query_start_loc[0] != 0:
            raise ValueError(
                f"query_start_loc must start at 0 and hold B + 1 >= 2 entries, got {query_start_loc}"
            )
        lens = [query_start_loc[b + 1] - query_start_loc[b] for b in range(num_requests)]
        if min(lens) < 1:
            raise ValueError(f"every request needs at least one token, got lengths {lens}")
        if len(read_slots) != num_requests or len(write_slots) != num_tokens:
            raise ValueError(
                f"need one read slot per request ({num_requests}) and one write slot per token ({num_tokens}), "
                f"got {len(read_slots)} and {len(write_slots)}"
            )
        max_len = max(lens)
        starts = torch.tensor(query_start_loc[:-1])  # (B,)
        lengths = torch.tensor(lens)  # (B,)
        offsets = torch.arange(max_len)  # (L,)
        valid = offsets[None, :] < lengths[:, None]  # (B, L)
        tokens = torch.where(valid, starts[:, None] + offsets[None, :], starts[:, None])  # (B, L)
        writes = torch.tensor(write_slots, dtype=torch.int64)  # (N,)
        token_request = torch.repeat_interleave(torch.arange(num_requests), lengths)  # (N,)
        token_offset = torch.arange(num_tokens) - starts[token_request]  # (N,) i of token t
        return cls(
            query_start_loc=list(query_start_loc),
            read_slots=torch.tensor(read_slots, dtype=torch.int64, device=device),
            write_slots=writes.to(device),
            host_write_slots=list(write_slots),
            # host facts only for a step on the CPU: elsewhere a captured graph may replay the index with
            # other slots, so the kernels take their general path (zero-filled reads, no block in place)
            zero_reads=min(read_slots) < 0 or device.type != "cpu",
            own_block=own_block(read_slots, write_slots, max_len) if device.type == "cpu" else None,
            max_query_len=max_len,
            padded_tokens=tokens.to(device),
            padded_write_slots=torch.where(valid, writes[tokens], -1).to(device),
            token_positions=(token_request * max_len + token_offset).to(device),
        )

    @property
    def num_requests(self) -> int:
        return len(self.query_start_loc) - 1


def own_block(
    read_slots: list[int], write_slots: list[int], max_query_len: int
) -> tuple[int, list[int]] | None:
    """(first slot, requests in slot order) when each request has one token, reads and writes the same slot, and
    the slots are distinct and consecutive (no other request touches them); None otherwise."""
    if max_query_len != 1 or read_slots != write_slots or min(read_slots) < 0:
        return None
    first = min(read_slots)
    if sorted(read_slots) != list(range(first, first + len(read_slots))):
        return None
    return first, sorted(range(len(read_slots)), key=read_slots.__getitem__)


def read_states(states: Tensor, slots: Tensor, *, zero_reads: bool = True) -> Tensor:
    """A copy of states[slots[b]] for each b, zeros where slots[b] == -1 (whatever that slot holds, NaN too).
    zero_reads=False, for a caller that knows on the host that no slot is -1, skips the masked pass."""
    gathered = states.index_select(0, slots.clamp(min=0))  # (B, *state_shape), a copy
    if not zero_reads:
        return gathered
    return gathered.masked_fill_((slots < 0).view(-1, *([1] * (states.dim() - 1))), 0)
