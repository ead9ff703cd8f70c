"""The Triton recurrent gated delta rule (kernels/triton_gated_delta.py) against kernels/gated_delta.py's torch short
path on the CPU: on CUDA when present, otherwise under TRITON_INTERPRET=1 (tests/conftest.py), whose numpy
interpreter keeps the shapes tiny. Then the CUDA dispatch, a CUDA graph replay and fla's long path (gpu-marked)."""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch
from torch import Tensor
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from openinfer.kernels.fla_gated_delta import Segment, gated_delta_rule_fla, segment_rounds
from openinfer.kernels.gated_delta import gated_delta_rule
from openinfer.kernels.kernel_backends import choose_kernel_backends
from openinfer.kernels.triton_gated_delta import gated_delta_rule_triton, read_conflicts
from tests.kernels.slot_batches import fresh_writes, make_index

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CPU = torch.device("cpu")
HK, HV, DK, DV = 2, 4, 16, 16  # GQA: each q/k head serves 2 v heads; DV = 2 tiles of BLOCK_V = 8 columns
NUM_SLOTS = 40
LENGTHS = [1, 16, 4, 2, 7]  # max 16: the short path
# Both compute in float32; bfloat16 outputs are rounded once, so they may differ by one ulp (2^-8 relative).
OUT_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def make_inputs(num_tokens: int, dtype: torch.dtype, seed: int) -> list[Tensor]:
    """q, k, v, g, beta on the CPU: q/k/v strided views of one projection, as the model's; Qwen3.5-like decays."""
    gen = torch.Generator().manual_seed(seed)
    mixed = torch.randn(num_tokens, 2 * HK * DK + HV * DV, generator=gen).to(dtype)
    q, k, v = mixed.split([HK * DK, HK * DK, HV * DV], dim=-1)
    g = -(torch.rand(HV, generator=gen) * 0.49 + 0.01) * torch.rand(num_tokens, HV, generator=gen)
    beta = torch.rand(num_tokens, HV, generator=gen).to(dtype)
    return [q.view(-1, HK, DK), k.view(-1, HK, DK), v.view(-1, HV, DV), g, beta]


def check(lengths: list[int], reads: list[int], writes: list[int], dtype: torch.dtype, seed: int = 0) -> None:
    """Triton on DEVICE against the torch short path on the CPU: outputs, every written slot (float32 states,
    1e-5) and every untouched slot bit for bit."""
    inputs = make_inputs(sum(lengths), dtype, seed)
    states = torch.randn(NUM_SLOTS, HV, DK, DV, generator=torch.Generator().manual_seed(seed + 1))
    expected_states = states.clone()
    expected = gated_delta_rule(*inputs, expected_states, make_index(lengths, reads, writes, CPU))
    got_states = states.to(DEVICE)
    index = make_index(lengths, reads, writes, DEVICE)
    got = gated_delta_rule_triton(*(x.to(DEVICE) for x in inputs), got_states, index)
    assert got.dtype == dtype and got.shape == expected.shape
    tolerance = OUT_TOLERANCE[dtype]
    torch.testing.assert_close(got.cpu().float(), expected.float(), atol=tolerance, rtol=tolerance)
    written = [s for s in writes if s >= 0]
    untouched = [s for s in range(NUM_SLOTS) if s not in written]
    torch.testing.assert_close(got_states.cpu()[written], expected_states[written], atol=1e-5, rtol=1e-5)
    assert torch.equal(got_states.cpu()[untouched], states[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("every_token", [True, False], ids=["verify-writes", "decode-writes"])
def test_equals_the_torch_short_path(every_token: bool, dtype: torch.dtype) -> None:
    """Varlen requests of 1..16 tokens, from zeros (even requests) and from slots 1 and 3, writing every token or
    each request's last: the torch path's outputs and states, untouched slots unchanged."""
    reads = [-1 if b % 2 == 0 else b for b in range(len(LENGTHS))]
    check(LENGTHS, reads, fresh_writes(LENGTHS, every_token), dtype, seed=int(every_token))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_writes_into_read_slots(dtype: torch.dtype) -> None:
    """Request 0 reads and writes slot 3 (its every token), requests 1 and 2 swap slots 1 and 2 (each writes the
    slot the other reads), request 3 starts from zeros: each starts from what its slot held before the step."""
    lengths = [3, 2, 16, 1]
    reads = [3, 1, 2, -1]
    writes = [3, 3, 3] + [-1, 2] + [-1] * 15 + [1] + [4]
    check(lengths, reads, writes, dtype, seed=5)


def test_read_conflicts() -> None:
    """A request is flagged when another request's token writes its read slot: not for its own writes, not for a
    shared read, not for slot -1."""
    lengths = [2, 1, 1, 1, 1]
    reads = [5, 6, 5, -1, 7]  # requests 0 and 2 share slot 5, which nobody writes
    writes = [6, 7, 9, -1, -1, -1]  # request 0 writes 6 (request 1's read) and 7 (request 4's); 1 writes 9
    index = make_index(lengths, reads, writes, CPU)
    assert read_conflicts(index).tolist() == [False, True, False, False, True]
    own = make_index([2], [4], [-1, 4], CPU)  # writing its own read slot needs no copy
    assert read_conflicts(own).tolist() == [False]


def test_segment_rounds() -> None:
    """fla's long path cuts each request after every written token; round r holds every request's r-th segment
    (a tail after the last write stores nothing)."""
    loc = [0, 5, 8, 10]
    writes = [-1, 4, -1, -1, 6] + [-1, -1, -1] + [-1, 9]  # request 0: after tokens 1 and 4; 1: none; 2: last
    assert segment_rounds(loc, writes) == [
        [Segment(0, 0, 2, 4), Segment(1, 5, 8, None), Segment(2, 8, 10, 9)],
        [Segment(0, 2, 5, 6)],
    ]


def stand_in_chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    g: Tensor,
    beta: Tensor,
    scale: float,
    initial_state: Tensor,
    output_final_state: bool,
    cu_seqlens: Tensor,
    use_qk_l2norm_in_kernel: bool,
) -> tuple[Tensor, Tensor]:
    """fla's chunk_gated_delta_rule as gated_delta_rule_fla calls it (varlen, batch 1, q/k heads = v heads),
    computed by transformers' torch reference one sequence at a time."""
    reference = inspect.unwrap(hf.torch_chunk_gated_delta_rule)
    assert scale == q.shape[-1] ** -0.5 and output_final_state and use_qk_l2norm_in_kernel
    bounds = cu_seqlens.tolist()
    outs, finals = [], []
    for n in range(len(bounds) - 1):
        span = slice(bounds[n], bounds[n + 1])
        out, final = reference(
            *(x[:, span] for x in (q, k, v, g, beta)),
            initial_state=initial_state[n : n + 1],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        outs.append(out.to(v.dtype))
        finals.append(final)
    return torch.cat(outs, dim=1), torch.cat(finals)


def test_fla_path_segments_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """gated_delta_rule_fla with a stand-in for fla's kernel (transformers' torch reference per sequence): cutting
    requests at their writes, chaining segment states and storing them gives the torch path's outputs and
    states, a write into another request's read slot included. (fla itself runs only on CUDA: the gpu test.)"""
    fake = types.ModuleType("fla.ops.gated_delta_rule")
    fake.chunk_gated_delta_rule = stand_in_chunk  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", fake)
    lengths = [70, 3, 20]
    reads, writes = [1, 2, -1], [-1] * sum(lengths)
    writes[9], writes[69], writes[72], writes[92] = 5, 6, 1, 7  # request 0 cut twice; 1 writes 0's read slot
    inputs = make_inputs(sum(lengths), torch.float32, seed=11)
    states = torch.randn(NUM_SLOTS, HV, DK, DV, generator=torch.Generator().manual_seed(11)) * 0.5
    expected_states = states.clone()
    index = make_index(lengths, reads, writes, CPU)
    expected = gated_delta_rule(*inputs, expected_states, index)
    got = gated_delta_rule_fla(*inputs, states, index)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states, expected_states, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_dispatch_and_graph_replay() -> None:
    """On CUDA, the engine's gated delta kernel (kernel_backends.py) runs Triton for a short step, and a CUDA graph
    of it replayed on new slots (now with a request writing another's read slot) and inputs gives the torch path's
    results for those."""
    cuda = torch.device("cuda")
    lengths = [1, 8, 8, 3]
    first = ([-1, 1, 2, 3], fresh_writes(lengths, every_token=True))
    second = (
        [4, -1, 1, 2],
        [1] + fresh_writes(lengths, every_token=False)[1:],
    )  # request 0 writes 2's read slot
    inputs = [x.to(cuda) for x in make_inputs(sum(lengths), torch.bfloat16, seed=7)]
    states = torch.randn(NUM_SLOTS, HV, DK, DV, generator=torch.Generator().manual_seed(7)).to(cuda)
    index = make_index(lengths, *first, cuda)
    rule = choose_kernel_backends(cuda).gated_delta.for_step(index)
    rule(*inputs, states.clone(), index)  # compile outside the capture
    static_states = states.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rule(*inputs, static_states, index)
    new_index = make_index(lengths, *second, cuda)
    for name in ("read_slots", "write_slots", "padded_tokens", "padded_write_slots", "token_positions"):
        getattr(index, name).copy_(getattr(new_index, name))
    new_inputs = make_inputs(sum(lengths), torch.bfloat16, seed=8)
    for static, new in zip(inputs, new_inputs, strict=True):
        static.copy_(new)
    static_states.copy_(states)
    graph.replay()
    expected_states = states.cpu()
    expected = gated_delta_rule(*new_inputs, expected_states, make_index(lengths, *second, CPU))
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(static_states.cpu(), expected_states, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fla_long_path_equals_torch() -> None:
    """On CUDA with fla installed (the gdn extra), the engine's gated delta kernel for a long step (prefill chunks,
    writes after several tokens of a request, a write into a read slot) gives the torch chunked path's outputs and
    states."""
    pytest.importorskip("fla.ops.gated_delta_rule")
    cuda = torch.device("cuda")
    lengths = [100, 3, 40]
    reads = [1, -1, 2]
    writes = [-1] * sum(lengths)
    writes[63], writes[99], writes[102], writes[142] = 5, 6, 1, 7  # request 0 cut at 64 and 100; 1 writes 1
    inputs = make_inputs(sum(lengths), torch.bfloat16, seed=9)
    states = torch.randn(NUM_SLOTS, HV, DK, DV, generator=torch.Generator().manual_seed(9)) * 0.5
    expected_states = states.clone()
    expected = gated_delta_rule(*inputs, expected_states, make_index(lengths, reads, writes, CPU))
    got_states = states.to(cuda)
    index = make_index(lengths, reads, writes, cuda)
    got = choose_kernel_backends(cuda).gated_delta.for_step(index)(
        *(x.to(cuda) for x in inputs), got_states, index
    )
    # fla runs its chunk products on bfloat16 operands where the torch path stays in float32
    torch.testing.assert_close(got.cpu().float(), expected.float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got_states.cpu(), expected_states, atol=3e-2, rtol=3e-2)
