"""Varlen batches over state slots for the Triton short-path tests (gated delta rule, causal conv)."""

from __future__ import annotations

import torch

from openinfer.kernels.state_index import StateIndex


def make_index(lengths: list[int], reads: list[int], writes: list[int], device: torch.device) -> StateIndex:
    loc = [0]
    for n in lengths:
        loc.append(loc[-1] + n)
    return StateIndex.build(loc, reads, writes, device)


def fresh_writes(lengths: list[int], every_token: bool) -> list[int]:
    """Every token (verification) or each request's last (decode) writes a slot of its own, from 8 on."""
    writes, slot = [], 8
    for n in lengths:
        for i in range(n):
            keep = every_token or i == n - 1
            writes.append(slot if keep else -1)
            slot += keep
    return writes
