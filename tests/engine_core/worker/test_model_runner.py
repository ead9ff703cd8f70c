"""ModelRunner's logits equal transformers' Qwen3ForCausalLM on the same tiny checkpoint (float32, CPU)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import transformers

from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.kernels.attention_metadata import AttentionMetadata

# Smaller than the built-in model; 4 query heads over 2 KV heads (GQA) come from TINY_QWEN3_CONFIG.
SMALL = SMALL_QWEN3
BLOCK_SIZE = 4  # small, so that every prompt spans several blocks
NUM_BLOCKS = 64
PROMPTS = [[3], [17, 4, 99, 250, 8], list(range(40, 53)), [(7 * i) % 256 for i in range(30)]]
ATOL = 1e-4


@dataclass
class Seq:
    """A test request: its tokens, how many are cached, and the blocks it holds."""

    tokens: list[int]
    num_cached: int = 0
    block_ids: list[int] = field(default_factory=list)


class ScatteredBlocks:
    """Hands out block ids from a shuffled pool, so tables are non-contiguous and out of order."""

    def __init__(self, seed: int) -> None:
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)

    def chunk(self, seq: Seq, num_tokens: int, num_logits: int) -> SeqChunk:
        """The next num_tokens of seq, growing its block table to cover them."""
        end = seq.num_cached + num_tokens
        while len(seq.block_ids) * BLOCK_SIZE < end:
            seq.block_ids.append(self.free.pop())
        chunk = SeqChunk(seq.tokens[seq.num_cached : end], seq.num_cached, list(seq.block_ids), num_logits)
        seq.num_cached = end
        return chunk


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt")
    return make_tiny_checkpoint(folder, seed=1, tie_word_embeddings=request.param, overrides=SMALL)


@pytest.fixture(scope="module")
def hf_model(checkpoint: Path) -> transformers.Qwen3ForCausalLM:
    model = transformers.Qwen3ForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


@pytest.fixture
def runner(checkpoint: Path) -> ModelRunner:
    return ModelRunner(checkpoint, torch.device("cpu"), NUM_BLOCKS, BLOCK_SIZE)


@torch.inference_mode()
def hf_logits(model: transformers.Qwen3ForCausalLM, tokens: list[int]) -> torch.Tensor:
    """Teacher-forced logits (len(tokens), vocab) of one sequence."""
    return model(torch.tensor([tokens])).logits[0].float()


def test_untied_checkpoint_has_its_own_head(checkpoint: Path, runner: ModelRunner) -> None:
    """The untied variant really stores lm_head.weight, and the runner loads it instead of the embedding."""
    head = runner.model.lm_head
    assert (head is None) == runner.model_config.tie_word_embeddings
    if head is not None:
        assert not torch.equal(head.weight, runner.model.model.embed_tokens.weight)


def test_one_batched_prefill(runner: ModelRunner, hf_model: transformers.Qwen3ForCausalLM) -> None:
    """Prompts of lengths 1, 5, 13 and 30 prefilled together in one execute give HF's logits at every
    position."""
    blocks = ScatteredBlocks(seed=0)
    chunks = [blocks.chunk(Seq(p), len(p), num_logits=len(p)) for p in PROMPTS]
    logits = runner.execute(chunk_step(chunks, runner)).logits
    assert logits.shape == (sum(map(len, PROMPTS)), SMALL["vocab_size"]) and logits.dtype == torch.float32
    expected = torch.cat([hf_logits(hf_model, p) for p in PROMPTS])
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_chunked_prefill(runner: ModelRunner, hf_model: transformers.Qwen3ForCausalLM) -> None:
    """The same prompts prefilled in uneven chunks over several executes give the same logits; chunks that
    ask for no logits (mid-prompt) still fill the cache the later chunks read."""
    blocks = ScatteredBlocks(seed=1)
    seqs = [Seq(p) for p in PROMPTS]
    sizes = [3, 1, 7, 2, 11, 5]  # cycled per step; a request's last chunk is whatever remains
    got: list[list[tuple[int, torch.Tensor]]] = [[] for _ in seqs]  # (first position, logits)
    for step in range(20):
        live = [i for i, s in enumerate(seqs) if s.num_cached < len(s.tokens)]
        if not live:
            break
        chunks, wanted = [], []
        for i in live:
            seq = seqs[i]
            n = min(sizes[(step + i) % len(sizes)], len(seq.tokens) - seq.num_cached)
            # Every other step, mid-prompt chunks ask for no logits, as the scheduler's chunks do.
            last = seq.num_cached + n == len(seq.tokens)
            num_logits = n if (step % 2 == 0 or last) else 0
            chunks.append(blocks.chunk(seq, n, num_logits))
            wanted.append((i, seq.num_cached - num_logits, num_logits))
        logits = runner.execute(chunk_step(chunks, runner)).logits
        row = 0
        for i, first_pos, num_logits in wanted:
            got[i].append((first_pos, logits[row : row + num_logits]))
            row += num_logits
        assert row == logits.shape[0]
    assert all(s.num_cached == len(s.tokens) for s in seqs)
    for seq, pieces in zip(seqs, got, strict=True):
        expected = hf_logits(hf_model, seq.tokens)
        for first_pos, piece in pieces:
            torch.testing.assert_close(piece, expected[first_pos : first_pos + len(piece)], atol=ATOL, rtol=0)


def test_greedy_decode_matches_hf(runner: ModelRunner, hf_model: transformers.Qwen3ForCausalLM) -> None:
    """20 greedy steps over a mixed batch (one request joins mid-way, its prefill running beside the others'
    decodes): every token is HF's teacher-forced argmax, or within 1e-3 of it in logit, and each step's
    logits equal HF's."""
    blocks = ScatteredBlocks(seed=2)
    seqs = [Seq(list(PROMPTS[1])), Seq(list(PROMPTS[2])), Seq(list(PROMPTS[3]))]
    step_logits: list[list[torch.Tensor]] = [[] for _ in seqs]
    for step in range(20):
        live = [i for i in range(len(seqs)) if i < 2 or step >= 5]  # request 2 arrives at step 5
        chunks = [blocks.chunk(seqs[i], len(seqs[i].tokens) - seqs[i].num_cached, 1) for i in live]
        logits = runner.execute(chunk_step(chunks, runner)).logits
        for i, row in zip(live, logits, strict=True):
            step_logits[i].append(row)
            seqs[i].tokens.append(int(row.argmax()))

    for seq, prompt, rows in zip(seqs, PROMPTS[1:], step_logits, strict=True):
        expected = hf_logits(hf_model, seq.tokens)[len(prompt) - 1 : -1]  # (generated, vocab)
        generated = seq.tokens[len(prompt) :]
        assert len(generated) == len(rows) and len(set(generated)) > 1  # a random model that still varies
        for pos, token in enumerate(generated):
            best = expected[pos].max()
            assert expected[pos, token] >= best - 1e-3, f"token {pos}: {token} is not HF's argmax"
        torch.testing.assert_close(torch.stack(rows), expected, atol=ATOL, rtol=0)


def test_aux_hidden_states(runner: ModelRunner, hf_model: transformers.Qwen3ForCausalLM) -> None:
    """forward_with_aux returns layer 0's output, transformers' hidden_states[1], beside the usual result."""
    prompt = PROMPTS[3]
    attn = AttentionMetadata.build([0], [len(prompt)], [list(range(8))], BLOCK_SIZE, runner.device)
    args = (torch.tensor(prompt), torch.arange(len(prompt)), runner.kv_caches, attn)
    with torch.inference_mode():
        hidden, aux = runner.model.forward_with_aux(*args, aux_layer_ids=[0])
        expected = hf_model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    assert len(aux) == 1
    torch.testing.assert_close(aux[0], expected[1][0], atol=ATOL, rtol=0)
    torch.testing.assert_close(hidden, expected[-1][0], atol=ATOL, rtol=0)  # after the final norm


def test_attention_bias_checkpoint(tmp_path: Path) -> None:
    """A checkpoint with q/k/v/o biases (attention_bias) loads into the packed projections, biases
    included, and a batched prefill then a decode step give HF's logits."""
    folder = make_tiny_checkpoint(tmp_path, seed=4, overrides={**SMALL, "attention_bias": True})
    hf = transformers.Qwen3ForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    runner = ModelRunner(folder, torch.device("cpu"), NUM_BLOCKS, BLOCK_SIZE)
    bias = runner.model.model.layers[0].self_attn.qkv_proj.bias
    assert bias is not None and bias.abs().sum() > 0  # drawn from N(0, 0.2), not left at zero
    blocks = ScatteredBlocks(seed=4)
    seqs = [Seq(list(p)) for p in PROMPTS[1:]]
    prefill = runner.execute(
        chunk_step([blocks.chunk(s, len(s.tokens), len(s.tokens)) for s in seqs], runner)
    ).logits
    for seq in seqs:
        seq.tokens.append(7)
    decode = runner.execute(chunk_step([blocks.chunk(s, 1, 1) for s in seqs], runner)).logits
    expected = [hf_logits(hf.eval(), s.tokens) for s in seqs]
    torch.testing.assert_close(prefill, torch.cat([e[:-1] for e in expected]), atol=ATOL, rtol=0)
    torch.testing.assert_close(decode, torch.stack([e[-1] for e in expected]), atol=ATOL, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_runner_matches_hf(checkpoint: Path, hf_model: transformers.Qwen3ForCausalLM) -> None:
    """On CUDA in float32, a batched prefill then 8 greedy steps give HF's (CPU) logits, to 1e-3."""
    runner = ModelRunner(checkpoint, torch.device("cuda"), NUM_BLOCKS, BLOCK_SIZE, torch.float32)
    blocks = ScatteredBlocks(seed=3)
    seqs = [Seq(list(p)) for p in PROMPTS]
    rows: list[list[torch.Tensor]] = [[] for _ in seqs]
    for _ in range(8):
        logits = runner.execute(
            chunk_step([blocks.chunk(s, len(s.tokens) - s.num_cached, 1) for s in seqs], runner)
        ).logits.cpu()
        for seq, row, got in zip(seqs, logits, rows, strict=True):
            got.append(row)
            seq.tokens.append(int(row.argmax()))
    for seq, prompt, got in zip(seqs, PROMPTS, rows, strict=True):
        expected = hf_logits(hf_model, seq.tokens)[len(prompt) - 1 : -1]
        torch.testing.assert_close(torch.stack(got), expected, atol=1e-3, rtol=0)


def test_bad_chunks_are_refused(runner: ModelRunner) -> None:
    """A block table too short for the chunk, or a block id outside the cache, is a clear error."""
    with pytest.raises(ValueError, match="cannot hold"):
        runner.execute(chunk_step([SeqChunk([1, 2, 3, 4, 5], 0, [0])], runner))
    with pytest.raises(ValueError, match="block ids"):
        runner.execute(chunk_step([SeqChunk([1], 0, [NUM_BLOCKS])], runner))
