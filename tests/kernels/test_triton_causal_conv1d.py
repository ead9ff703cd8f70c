"""The Triton causal conv (kernels/triton_causal_conv1d.py) against kernels/gated_delta.py's torch short path on the
CPU: on CUDA when present, otherwise under TRITON_INTERPRET=1 (tests/conftest.py), whose numpy interpreter keeps
the shapes tiny. Then the CUDA dispatch and a CUDA graph replay (gpu-marked)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from openinfer.kernels import triton_causal_conv1d
from openinfer.kernels.gated_delta import causal_conv1d
from openinfer.kernels.kernel_backends import choose_kernel_backends
from openinfer.kernels.triton_causal_conv1d import causal_conv1d_triton
from tests.kernels.slot_batches import fresh_writes, make_index

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CPU = torch.device("cpu")
CHANNELS, WIDTH = 48, 4
BLOCK = 32  # channels per program: 2 tiles, the second half masked
NUM_SLOTS = 40
LENGTHS = [1, 16, 4, 2, 7]  # max 16: the short path
# Both sum in float32 and round to bfloat16 twice, the conv's sum and then SiLU, as torch does: a GPU rounds to
# nearest as torch does, the interpreter truncates, so an output may land an ulp of the sum (2^-8..2^-7 of it)
# from torch's at each rounding. SiLU's slope is at most 1.1, and under 0.3 where the sum is negative.
OUT_TOLERANCE = {torch.float32: (1e-6, 1e-6), torch.bfloat16: (2**-8, 2**-6)}  # (atol, rtol)


def make_inputs(num_tokens: int, dtype: torch.dtype, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """x (N, C) a strided view of a wider projection (as the model's in_proj split), weight (C, W) a view of a
    conv1d's (C, 1, W) weight, conv_state (S, C, W-1), all in dtype, on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, CHANNELS + 20, generator=gen).to(dtype)[:, :CHANNELS]
    weight = (torch.randn(CHANNELS, 1, WIDTH, generator=gen) * 0.5).to(dtype)[:, 0]
    conv_state = torch.randn(NUM_SLOTS, CHANNELS, WIDTH - 1, generator=gen).to(dtype)
    return x, weight, conv_state


def check(lengths: list[int], reads: list[int], writes: list[int], dtype: torch.dtype, seed: int = 0) -> None:
    """Triton on DEVICE against the torch short path on the CPU: outputs, every written window bit for bit (both
    copy inputs) and every untouched slot unchanged."""
    x, weight, states = make_inputs(sum(lengths), dtype, seed)
    expected_states = states.clone()
    expected = causal_conv1d(x, weight, expected_states, make_index(lengths, reads, writes, CPU))
    got_states = states.to(DEVICE)
    index = make_index(lengths, reads, writes, DEVICE)
    got = causal_conv1d_triton(x.to(DEVICE), weight.to(DEVICE), got_states, index, block_channels=BLOCK)
    assert got.dtype == dtype and got.shape == expected.shape
    atol, rtol = OUT_TOLERANCE[dtype]
    torch.testing.assert_close(got.cpu(), expected, atol=atol, rtol=rtol)
    written = [s for s in writes if s >= 0]
    untouched = [s for s in range(NUM_SLOTS) if s not in written]
    assert torch.equal(got_states.cpu()[written], expected_states[written])
    assert torch.equal(got_states.cpu()[untouched], states[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("every_token", [True, False], ids=["verify-writes", "decode-writes"])
def test_equals_the_torch_short_path(every_token: bool, dtype: torch.dtype) -> None:
    """Varlen requests of 1..16 tokens, from zeros (even requests) and from slots 1 and 3, writing every token or
    each request's last: the torch path's outputs and windows, untouched slots unchanged."""
    reads = [-1 if b % 2 == 0 else b for b in range(len(LENGTHS))]
    check(LENGTHS, reads, fresh_writes(LENGTHS, every_token), dtype, seed=int(every_token))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_writes_into_read_slots(dtype: torch.dtype) -> None:
    """Request 0 reads slot 3 and writes it after its last token (the others' to 5 and 6), requests 1 and 2 swap
    slots 1 and 2 (each writes the slot the other reads), request 3 starts from zeros: each starts from what its
    slot held before the step. (One slot per token: the torch path stores every window at once.)"""
    lengths = [3, 2, 16, 1]
    reads = [3, 1, 2, -1]
    writes = [5, 6, 3] + [-1, 2] + [-1] * 15 + [1] + [4]
    check(lengths, reads, writes, dtype, seed=5)


def test_reads_nothing_of_slot_minus_one() -> None:
    """A request reading slot -1 starts from zeros whatever slot 0 (the clamped index) holds, NaN included."""
    x, weight, states = make_inputs(2, torch.float32, seed=3)
    states[0] = float("nan")
    index = make_index([2], [-1], [-1, 5], DEVICE)
    got_states = states.to(DEVICE)
    got = causal_conv1d_triton(x.to(DEVICE), weight.to(DEVICE), got_states, index, block_channels=BLOCK)
    # token 0 meets only the newest tap; token 1 the two newest
    expected = torch.stack([x[0] * weight[:, 3], x[0] * weight[:, 2] + x[1] * weight[:, 3]])
    torch.testing.assert_close(got.cpu(), torch.nn.functional.silu(expected), atol=1e-6, rtol=1e-6)
    assert torch.equal(got_states.cpu()[5], torch.stack([torch.zeros(CHANNELS), x[0], x[1]], dim=1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_dispatch_and_graph_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA, the engine's causal conv (kernel_backends.py) runs the Triton kernel for a short step, and a CUDA
    graph of it replayed on new slots (now with a request writing another's read slot) and inputs gives the torch
    path's results for those."""
    calls = []

    def counted(*args: object, **kwargs: object) -> Tensor:
        calls.append(1)
        return causal_conv1d_triton(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(triton_causal_conv1d, "causal_conv1d_triton", counted)
    cuda = torch.device("cuda")
    lengths = [1, 8, 8, 3]
    first = ([-1, 1, 2, 3], fresh_writes(lengths, every_token=True))
    second = (
        [4, -1, 1, 2],
        [1] + fresh_writes(lengths, every_token=False)[1:],
    )  # request 0 writes 2's read slot
    x, weight, states = (t.to(cuda) for t in make_inputs(sum(lengths), torch.bfloat16, seed=7))
    x = x.contiguous()
    index = make_index(lengths, *first, cuda)
    conv = choose_kernel_backends(cuda).causal_conv.for_step(index)
    conv(x, weight, states.clone(), index)  # compile outside the capture
    assert calls == [1]
    static_states = states.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = conv(x, weight, static_states, index)
    new_index = make_index(lengths, *second, cuda)
    for name in ("read_slots", "write_slots", "padded_tokens", "padded_write_slots", "token_positions"):
        getattr(index, name).copy_(getattr(new_index, name))
    new_x = make_inputs(sum(lengths), torch.bfloat16, seed=8)[0]
    x.copy_(new_x)
    static_states.copy_(states)
    graph.replay()
    expected_states = states.cpu()
    expected = causal_conv1d(new_x, weight.cpu(), expected_states, make_index(lengths, *second, CPU))
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=2**-8, rtol=2**-6)
    assert torch.equal(static_states.cpu(), expected_states)
