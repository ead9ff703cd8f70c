"""kernels/gated_delta.py against transformers' Qwen3.5 reference functions run on each request alone (batch 1,
initial_state, output_final_state): both forms (batched recurrent for short steps, per-request chunked for long
ones), varlen batches from zeros and from stored states, per-token and last-token writes, a write slot equal to a
read slot, GQA (Hv = 2 * Hk), and a sequence split over several steps continuing exactly."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from openinfer.kernels.gated_delta import causal_conv1d, gated_delta_rule, masked_store
from openinfer.kernels.state_index import RECURRENT_MAX_QUERY_LEN, StateIndex

# The torch reference bodies: transformers swaps in flash-linear-attention's kernels when `fla` is importable,
# and its decorator keeps the torch function as __wrapped__.
hf_chunk = inspect.unwrap(hf.torch_chunk_gated_delta_rule)
hf_recurrent = inspect.unwrap(hf.torch_recurrent_gated_delta_rule)
hf_conv_fn = inspect.unwrap(hf.causal_conv1d_fn)
hf_conv_update = inspect.unwrap(hf.causal_conv1d_update)

DEVICE = torch.device("cpu")
HK, HV, DK, DV = 2, 4, 16, 8  # GQA: each q/k head serves 2 v heads
CHANNELS, WIDTH = 2 * HK * DK + HV * DV, 4  # the conv runs over the packed [q, k, v] projection
NUM_SLOTS = 6 + 320  # reads use slots 1..5, token writes each get a fresh slot from 6 on
SHORT = [1, 3, RECURRENT_MAX_QUERY_LEN, 1, 7]  # max 16: the batched recurrent form
LONG = [150, 1, 65, 17, 64, 3]  # max 150: per request, chunked past 16 (150 = 2 chunks of 64 + 22)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@dataclass
class Batch:
    lengths: list[int]
    read_slots: list[int]
    write_slots: list[int]
    index: StateIndex

    def span(self, b: int) -> slice:
        return slice(self.index.query_start_loc[b], self.index.query_start_loc[b + 1])


def make_batch(lengths: list[int], every_token: bool, read_slots: list[int] | None = None) -> Batch:
    """Even requests start from zeros, odd request b from slot b; every token (verify-like) or each request's
    last token (prefill-like) writes a slot of its own, from 6 on."""
    loc = [0]
    for n in lengths:
        loc.append(loc[-1] + n)
    reads = read_slots if read_slots is not None else [-1 if b % 2 == 0 else b for b in range(len(lengths))]
    writes = [-1] * loc[-1]
    free = iter(range(6, NUM_SLOTS))  # never exhausted: at most 320 tokens
    for b in range(len(lengths)):
        tokens = range(loc[b], loc[b + 1])
        chosen = tokens if every_token else tokens[-1:]
        for t in chosen:
            writes[t] = next(free)
    return Batch(lengths, reads, writes, StateIndex.build(loc, reads, writes, DEVICE))


def delta_inputs(num_tokens: int, dtype: torch.dtype, seed: int) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    mixed = torch.randn(num_tokens, CHANNELS, generator=g).to(
        dtype
    )  # the conv output, as the model splits it
    q, k, v = mixed.split([HK * DK, HK * DK, HV * DV], dim=-1)  # strided views, not contiguous
    q, k, v = q.view(-1, HK, DK), k.view(-1, HK, DK), v.view(-1, HV, DV)
    # Qwen3.5's gates, g = -exp(A_log) * softplus(a + dt_bias) in float32, with A = exp(A_log) in [0.01, 0.5]:
    # decays around e^-0.2 per token, so a stored initial state still shows in a request's first ~20 outputs
    a_coef = torch.rand(HV, generator=g) * 0.49 + 0.01
    decay = -a_coef * torch.nn.functional.softplus(torch.randn(num_tokens, HV, generator=g))
    beta = torch.rand(num_tokens, HV, generator=g).to(dtype)
    return q, k, v, decay, beta


def random_states(seed: int) -> Tensor:
    return torch.randn(NUM_SLOTS, HV, DK, DV, generator=torch.Generator().manual_seed(seed)) * 0.5


def reference_delta(
    batch: Batch, b: int, inputs: tuple[Tensor, ...], states: Tensor
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Request b alone through transformers: its outputs (chunked form), its final state, and its state after each
    token (the recurrent form one token at a time, each step from the last one's final state)."""
    q, k, v, g, beta = (x[None, batch.span(b)] for x in inputs)
    read = batch.read_slots[b]
    h0 = None if read < 0 else states[read : read + 1].clone()
    kwargs = {"output_final_state": True, "use_qk_l2norm_in_kernel": True}
    out, final = hf_chunk(q, k, v, g, beta, initial_state=h0, **kwargs)
    after: list[Tensor] = []
    h = h0
    for t in range(q.shape[1]):
        step = (x[:, t : t + 1] for x in (q, k, v, g, beta))
        _, h = hf_recurrent(*step, initial_state=h, **kwargs)
        after.append(h[0])
    return out[0], final[0], after


@pytest.mark.parametrize("lengths", [SHORT, LONG], ids=["recurrent", "chunked"])
@pytest.mark.parametrize("every_token", [True, False], ids=["verify-writes", "prefill-writes"])
def test_gated_delta_matches_transformers(lengths: list[int], every_token: bool) -> None:
    """Each request's outputs and every written state are transformers' on that request alone, within 1e-5;
    slots with no write keep their values bit for bit."""
    batch = make_batch(lengths, every_token)
    inputs = delta_inputs(sum(lengths), torch.float32, seed=len(lengths))
    states = random_states(seed=1)
    before = states.clone()
    out = gated_delta_rule(*inputs, states, batch.index)
    written = set()
    for b in range(len(lengths)):
        expected, final, after = reference_delta(batch, b, inputs, before)
        torch.testing.assert_close(out[batch.span(b)], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(after[-1], final, atol=1e-5, rtol=1e-5)  # the two reference forms agree
        for t, slot in enumerate(batch.write_slots[batch.span(b)]):
            if slot >= 0:
                torch.testing.assert_close(states[slot], after[t], atol=1e-5, rtol=1e-5)
                written.add(slot)
    untouched = [s for s in range(NUM_SLOTS) if s not in written]
    assert torch.equal(states[untouched], before[untouched])


@pytest.mark.parametrize("lengths", [SHORT, LONG], ids=["recurrent", "chunked"])
def test_gated_delta_bfloat16(lengths: list[int]) -> None:
    """bfloat16 q/k/v/beta: outputs in bfloat16 within 2e-2 of transformers on the same bfloat16 inputs (both
    compute in float32; what is left is the output's rounding and float32 summation order)."""
    batch = make_batch(lengths, every_token=False)
    inputs = delta_inputs(sum(lengths), torch.bfloat16, seed=7)
    states = random_states(seed=2)
    before = states.clone()
    out = gated_delta_rule(*inputs, states, batch.index)
    assert out.dtype == torch.bfloat16
    for b in range(len(lengths)):
        expected, final, _ = reference_delta(batch, b, inputs, before)
        torch.testing.assert_close(out[batch.span(b)].float(), expected.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(states[batch.write_slots[batch.span(b)][-1]], final, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("lengths", [[1, 2, 1], [1, 40, 1]], ids=["recurrent", "chunked"])
def test_write_slot_equal_to_read_slot(lengths: list[int]) -> None:
    """Requests 0 and 1 swap slots 1 and 2 (request 0 writes the slot request 1 then reads) and request 2 writes
    back into its own read slot 3: every request still starts from what its slot held before the step, for the
    recurrent and the conv state alike."""
    loc = [0, lengths[0], lengths[0] + lengths[1], sum(lengths)]
    writes = [-1] * loc[-1]
    writes[loc[1] - 1], writes[loc[2] - 1], writes[loc[3] - 1] = 2, 1, 3
    batch = Batch(lengths, [1, 2, 3], writes, StateIndex.build(loc, [1, 2, 3], writes, DEVICE))
    inputs = delta_inputs(loc[-1], torch.float32, seed=3)
    states = random_states(seed=3)
    before = states.clone()
    out = gated_delta_rule(*inputs, states, batch.index)
    x, weight, conv_state = conv_inputs(loc[-1], torch.float32, seed=3)
    conv_before = conv_state.clone()
    conv_out = causal_conv1d(x, weight, conv_state, batch.index)
    for b, slot in enumerate([2, 1, 3]):
        expected, final, _ = reference_delta(batch, b, inputs, before)
        torch.testing.assert_close(out[batch.span(b)], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[slot], final, atol=1e-5, rtol=1e-5)
        tokens = x[batch.span(b)].T[None]  # (1, C, L)
        history = conv_before[b + 1 : b + 2].clone()
        expected_conv = hf_conv_update(tokens, history, weight, None, activation="silu")  # updates history
        torch.testing.assert_close(conv_out[batch.span(b)], expected_conv[0].T, atol=1e-5, rtol=1e-5)
        assert torch.equal(conv_state[slot], history[0])


def conv_inputs(num_tokens: int, dtype: torch.dtype, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, CHANNELS, generator=g).to(dtype)
    weight = (torch.randn(CHANNELS, WIDTH, generator=g) * 0.5).to(dtype)
    conv_state = torch.randn(NUM_SLOTS, CHANNELS, WIDTH - 1, generator=g).to(dtype)
    return x, weight, conv_state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [SHORT, LONG], ids=["recurrent", "chunked"])
def test_conv_matches_transformers(lengths: list[int], dtype: torch.dtype) -> None:
    """Outputs are transformers' causal_conv1d_fn (from zeros) or causal_conv1d_update (from a stored state) on
    each request alone; each written slot holds exactly the W-1 inputs ending at its token."""
    batch = make_batch(lengths, every_token=True)
    x, weight, conv_state = conv_inputs(sum(lengths), dtype, seed=len(lengths))
    before = conv_state.clone()
    out = causal_conv1d(x, weight, conv_state, batch.index)
    for b in range(len(lengths)):
        tokens = x[batch.span(b)].T[None]  # (1, C, L)
        read = batch.read_slots[b]
        if read < 0:
            expected = hf_conv_fn(tokens, weight, None, activation="silu")
            history = torch.zeros(CHANNELS, WIDTH - 1, dtype=dtype)
        else:
            expected = hf_conv_update(
                tokens, before[read : read + 1].clone(), weight, None, activation="silu"
            )
            history = before[read]
        torch.testing.assert_close(out[batch.span(b)], expected[0].T, **tolerance(dtype))
        inputs = torch.cat([history, tokens[0]], dim=1)  # (C, W-1 + L)
        for t, slot in enumerate(batch.write_slots[batch.span(b)]):
            if slot >= 0:
                assert torch.equal(conv_state[slot], inputs[:, t + 1 : t + WIDTH])


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": TOLERANCE[dtype], "rtol": TOLERANCE[dtype]}


def test_split_sequence_continues_exactly() -> None:
    """One 100-token request run as prefill 40 (chunked form) -> decode 1 -> verify 5 -> rest 54, each step from
    the slot the last one wrote, gives the outputs and final states of the whole sequence in one call."""
    lengths = [40, 1, 5, 54]
    x, weight, conv_whole = conv_inputs(100, torch.float32, seed=5)
    inputs = delta_inputs(100, torch.float32, seed=5)
    state_whole = random_states(seed=5)
    whole = StateIndex.build([0, 100], [-1], [-1] * 99 + [0], DEVICE)
    expected_conv = causal_conv1d(x, weight, conv_whole, whole)
    expected = gated_delta_rule(*inputs, state_whole, whole)
    conv_split, state_split = conv_whole.clone(), random_states(seed=5)
    start, read = 0, -1
    for step, n in enumerate(lengths):
        write = 1 + step % 2  # alternate slots 1 and 2
        index = StateIndex.build([0, n], [read], [-1] * (n - 1) + [write], DEVICE)
        span = slice(start, start + n)
        conv_out = causal_conv1d(x[span], weight, conv_split, index)
        assert torch.equal(conv_out, expected_conv[span])
        out = gated_delta_rule(*(t[span] for t in inputs), state_split, index)
        torch.testing.assert_close(out, expected[span], atol=1e-5, rtol=1e-5)
        start, read = start + n, write
    assert torch.equal(conv_split[read], conv_whole[0])
    torch.testing.assert_close(state_split[read], state_whole[0], atol=1e-5, rtol=1e-5)


def test_short_path_runs_on_meta_tensors() -> None:
    """A decode/verify-sized step runs on the meta device, which refuses .item() and data-dependent shapes: the
    recurrent path has no host sync, as CUDA graph capture needs."""
    meta = torch.device("meta")
    index = StateIndex.build([0, 1, 4, 6], [-1, 2, 3], [5, -1, -1, 7, -1, 8], meta)
    conv_out = causal_conv1d(
        torch.empty(6, CHANNELS, device=meta),
        torch.empty(CHANNELS, WIDTH, device=meta),
        torch.empty(NUM_SLOTS, CHANNELS, WIDTH - 1, device=meta),
        index,
    )
    q, k = torch.empty(6, HK, DK, device=meta), torch.empty(6, HK, DK, device=meta)
    v, gates = torch.empty(6, HV, DV, device=meta), torch.empty(6, HV, device=meta)
    out = gated_delta_rule(q, k, v, gates, gates, torch.empty(NUM_SLOTS, HV, DK, DV, device=meta), index)
    assert (conv_out.shape, out.shape) == ((6, CHANNELS), (6, HV, DV))


def test_masked_store() -> None:
    """Rows with slot -1 store nothing, whether some rows are kept or none."""
    dest = torch.arange(6.0)[:, None].repeat(1, 2)  # row s holds [s, s]
    masked_store(dest, torch.tensor([-1, 3, -1, 5]), torch.full((4, 2), 9.0))
    assert dest[:, 0].tolist() == [0.0, 1.0, 2.0, 9.0, 4.0, 9.0]
    masked_store(dest, torch.tensor([-1, -1]), torch.full((2, 2), 7.0))
    assert dest[:, 0].tolist() == [0.0, 1.0, 2.0, 9.0, 4.0, 9.0]


@pytest.mark.parametrize(
    ("reads", "writes", "block"),
    [
        ([5, 3, 4, 6], [5, 3, 4, 6], (3, [1, 2, 0, 3])),  # own slots 3..6: updated in place, in slot order
        ([3, 4, 5], [4, 3, 5], None),  # 0 and 1 swap: each writes the slot the other reads
        ([3, 5], [3, 5], None),  # own slots, not consecutive
        ([-1, 4], [3, 4], None),  # request 0 starts from zeros
    ],
    ids=["own-block", "swap", "gap", "from-zeros"],
)
def test_decode_state_slots(reads: list[int], writes: list[int], block: tuple[int, list[int]] | None) -> None:
    """A decode step (one token a request) matches transformers on each request alone whichever CPU path its
    slots take (in place on a block of its own slots, or gathered and stored), and leaves other slots bit for
    bit; a step with a read slot another request writes never takes the in-place path."""
    loc = list(range(len(reads) + 1))
    batch = Batch([1] * len(reads), reads, writes, StateIndex.build(loc, reads, writes, DEVICE))
    assert batch.index.own_block == block
    assert batch.index.zero_reads == (min(reads) < 0)
    inputs = delta_inputs(len(reads), torch.float32, seed=11)
    states = random_states(seed=11)
    before = states.clone()
    out = gated_delta_rule(*inputs, states, batch.index)
    x, weight, conv_state = conv_inputs(len(reads), torch.float32, seed=11)
    conv_before = conv_state.clone()
    conv_out = causal_conv1d(x, weight, conv_state, batch.index)
    for b, (read, write) in enumerate(zip(reads, writes, strict=True)):
        expected, final, _ = reference_delta(batch, b, inputs, before)
        torch.testing.assert_close(out[b : b + 1], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[write], final, atol=1e-5, rtol=1e-5)
        history = torch.zeros(1, CHANNELS, WIDTH - 1) if read < 0 else conv_before[read : read + 1].clone()
        expected_conv = hf_conv_update(x[b : b + 1].T[None], history, weight, None, activation="silu")
        torch.testing.assert_close(conv_out[b : b + 1], expected_conv[0].T, atol=1e-5, rtol=1e-5)
        assert torch.equal(conv_state[write], history[0])
    untouched = [s for s in range(NUM_SLOTS) if s not in writes]
    assert torch.equal(states[untouched], before[untouched])
    assert torch.equal(conv_state[untouched], conv_before[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch_size", [8, 9], ids=["tap-sum", "conv1d"])
def test_conv_forms_match_transformers(batch_size: int, dtype: torch.dtype) -> None:
    """Both forms of the short conv match transformers' causal_conv1d_update: 8 requests x 2048 channels =
    16384 outputs (CONV_SUM_MAX_OUTPUTS) sum the taps, 9 x 2048 call conv1d."""
    channels, g = 2048, torch.Generator().manual_seed(13)
    x = torch.randn(batch_size, channels, generator=g).to(dtype)
    weight = (torch.randn(channels, WIDTH, generator=g) * 0.5).to(dtype)
    conv_state = torch.randn(batch_size, channels, WIDTH - 1, generator=g).to(dtype)
    before = conv_state.clone()
    slots = list(range(batch_size))
    out = causal_conv1d(
        x, weight, conv_state, StateIndex.build(list(range(batch_size + 1)), slots, slots, DEVICE)
    )
    expected = hf_conv_update(x[:, :, None], before.clone(), weight, None, activation="silu")  # (B, C, 1)
    torch.testing.assert_close(out, expected[:, :, 0], **tolerance(dtype))
    assert torch.equal(conv_state, torch.cat([before[:, :, 1:], x[:, :, None]], dim=2))
