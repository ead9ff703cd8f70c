"""The chunked form of the gated delta rule for one request (transformers' `torch_chunk_gated_delta_rule`
algorithm, chunks of 64, float32), storing the state after any of its tokens.

Within a chunk, with c_t the cumulative log-decay from the chunk's start to position t, the recurrence
S_t = e^{g_t} S_{t-1} + k_t u_t^T, u_t = beta_t (v_t - k_t^T e^{g_t} S_{t-1}) unrolls to
S_t = e^{c_t} S_0 + sum_{j <= t} e^{c_t - c_j} k_j u_j^T, and the u of a whole chunk solve one unit lower
triangular system (the UT transform): (I + strictly_lower(beta_i k_i.k_j e^{c_i - c_j})) U = beta V - (beta K
e^{c}) S_0. So the state after any token of the chunk is one small product, which is how token writes are served.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_SIZE = 64


def chunk_gated_delta(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    h0: Tensor,
    state: Tensor,
    writes: list[tuple[int, int]],
) -> Tensor:
    """One request, float32: q (normalised and scaled), k (L, H, Dk); v (L, H, Dv); g, beta (L, H); h0 (H, Dk, Dv)
    the state before its first token. For each (i, slot) in writes, state[slot] = the state after token i.
    Returns the outputs (L, H, Dv)."""
    length, heads, _ = k.shape
    pad = -length % CHUNK_SIZE
    num_chunks = (length + pad) // CHUNK_SIZE

    def chunked(x: Tensor) -> Tensor:  # (L, H, D) -> (H, n, C, D), padded with zeros
        x = F.pad(x.transpose(0, 1), (0, 0, 0, pad))
        return x.reshape(heads, num_chunks, CHUNK_SIZE, x.shape[-1])

    # Padded positions have g = 0 and k = v = beta = 0: decay 1, no update, so the last state is exact.
    qc, kc, vc = chunked(q), chunked(k), chunked(v)  # (H, n, C, D)
    gc, bc = (chunked(x[..., None])[..., 0] for x in (g, beta))  # (H, n, C)
    cum = gc.cumsum(dim=-1)  # (H, n, C) c_t within each chunk
    causal = torch.ones(CHUNK_SIZE, CHUNK_SIZE, dtype=torch.bool, device=q.device).tril()
    pair_decay = (
        (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    )  # (H,n,C,C)
    k_beta = kc * bc[..., None]
    system = (k_beta @ kc.transpose(-1, -2)) * pair_decay  # (H, n, C, C); only its strict lower part is used
    new_values = torch.linalg.solve_triangular(system, vc * bc[..., None], upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(
        system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True
    )
    intra = (qc @ kc.transpose(-1, -2)) * pair_decay  # (H, n, C, C) within-chunk attention, causal
    q_decayed = qc * cum.exp()[..., None]  # reads S_0 decayed to each position
    k_to_end = kc * (cum[..., -1:] - cum).exp()[..., None]  # each key decayed to the chunk's end
    chunk_decay = cum[..., -1].exp()[..., None, None]  # (H, n, 1, 1)

    by_chunk: dict[int, list[tuple[int, int]]] = {}
    for i, slot in writes:
        by_chunk.setdefault(i // CHUNK_SIZE, []).append((i % CHUNK_SIZE, slot))
    out = torch.empty(heads, num_chunks, CHUNK_SIZE, v.shape[-1], dtype=v.dtype, device=v.device)
    h = h0  # (H, Dk, Dv)
    for n in range(num_chunks):
        u = new_values[:, n] - k_cumdecay[:, n] @ h  # (H, C, Dv) each position's update
        out[:, n] = q_decayed[:, n] @ h + intra[:, n] @ u
        if n in by_chunk:
            _store_within_chunk(state, by_chunk[n], h, kc[:, n], u, cum[:, n])
        h = h * chunk_decay[:, n] + k_to_end[:, n].transpose(-1, -2) @ u
    return out.reshape(heads, -1, v.shape[-1])[:, :length].transpose(0, 1)


def _store_within_chunk(
    state: Tensor, writes: list[tuple[int, int]], h: Tensor, k: Tensor, u: Tensor, cum: Tensor
) -> None:
    """state[slot] = S_p = e^{c_p} S_0 + sum_{j <= p} e^{c_p - c_j} k_j u_j^T for each (p, slot) in writes:
    h (H, Dk, Dv) = S_0, the state at the chunk's start; k (H, C, Dk); u (H, C, Dv); cum (H, C)."""
    positions = torch.tensor([p for p, _ in writes], device=h.device)  # (P,)
    slots = torch.tensor([s for _, s in writes], device=h.device)  # (P,)
    upto = torch.arange(CHUNK_SIZE, device=h.device)[None, :] <= positions[:, None]  # (P, C) j <= p
    cum_p = cum[:, positions]  # (H, P)
    weights = (cum_p[..., None] - cum[:, None, :]).masked_fill(~upto, float("-inf")).exp()  # (H, P, C)
    weighted_k = (weights[..., None] * k[:, None]).transpose(-1, -2)  # (H, P, Dk, C)
    states = cum_p.exp()[..., None, None] * h[:, None] + weighted_k @ u[:, None]  # (H, P, Dk, Dv)
    state.index_copy_(0, slots, states.transpose(0, 1))
