"""The KV cache's size: --num-kv-blocks, else --kv-cache-gb, else on CUDA --gpu-memory-utilization's share
less the weights, activations and reserve (the arithmetic only: CUDA is not needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openinfer.engine_core.config import DrafterSpec, EngineConfig
from openinfer.engine_core.core.kv_sizing import (
    CUDA_RESERVE_BYTES,
    GIB,
    GpuMemory,
    activation_bytes,
    checkpoint_bytes,
    cuda_kv_budget,
    kv_block_bytes,
    num_kv_blocks,
    state_slot_bytes,
)
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.kv_geometry import page_bytes
from openinfer.engine_core.models.qwen3 import Qwen3ForCausalLM
from openinfer.engine_core.models.qwen3_5 import Qwen3_5ForCausalLM
from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.process.engine_args import config_from_args, parse_args
from openinfer.engine_core.process.engine_cli import load_runner
from openinfer.engine_core.spec_decode.spec_decoder import SpecDecoder
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.kernels.kernel_backends import choose_kernel_backends

H200 = GpuMemory(free=140 * GIB, total=141 * GIB)


def test_the_share_less_weights_activations_and_reserve_is_the_kv_cache() -> None:
    """0.9 of 141 GiB = 126.9 GiB; less 16 GiB of weights, 2 GiB of activations and the 1 GiB reserve:
    107.9 GiB of KV cache."""
    budget = cuda_kv_budget(H200, 0.9, 16 * GIB, 2 * GIB)
    assert budget.requested == int(0.9 * 141 * GIB)
    assert budget.kv_bytes == int(0.9 * 141 * GIB) - 19 * GIB
    assert "KV cache 107.90 GiB = 126.90 GiB allowed - weights 16.00" in budget.describe()


def test_memory_others_use_must_be_free_not_taken_from_the_share() -> None:
    """As vLLM: 0.9 of the GPU must be free at start; 0.5 of a half-used GPU is fine."""
    half_used = GpuMemory(free=70 * GIB, total=140 * GIB)
    with pytest.raises(ValueError, match="asks for 126.00 GiB of this GPU's 140.00 GiB, but only 70.00 GiB"):
        cuda_kv_budget(half_used, 0.9, GIB, GIB)
    assert cuda_kv_budget(half_used, 0.5, GIB, GIB).kv_bytes == 70 * GIB - 2 * GIB - CUDA_RESERVE_BYTES


def test_a_share_the_model_fills_is_refused_naming_what_to_change() -> None:
    with pytest.raises(ValueError, match="leaves no KV cache .* raise it, lower --max-num-batched-tokens"):
        cuda_kv_budget(H200, 0.1, 14 * GIB, 0)


def test_activation_bound() -> None:
    """Qwen3-8B's widths (hidden 4096, 32 query and 8 KV heads of 128, MLP 12288, vocabulary 151936),
    512 tokens a step in bfloat16: 512 x (3*4096 + 4096 + 2*1024 + 3*12288) x 2 bytes of layer tensors, plus
    3 float32 vocabulary rows for each of the min(512, 64 x 8) = 512 sampled tokens."""
    config = ModelConfig(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
        max_position_embeddings=40960, tie_word_embeddings=False, attention_bias=False, eos_token_ids=(1,),
        torch_dtype=torch.bfloat16,
    )  # fmt: skip
    layer = 512 * (3 * 4096 + 4096 + 2 * 1024 + 3 * 12288) * 2
    assert activation_bytes(config, 512, 64, 7, torch.bfloat16) == layer + 3 * 512 * 151936 * 4
    assert activation_bytes(config, 512, 4, 0, torch.bfloat16) == layer + 3 * 4 * 151936 * 4


def test_checkpoint_bytes_count_every_tensor_at_the_engine_dtype(tmp_path: Path) -> None:
    """The target's parameters (tied LM head counted once) and a DFlash drafter's, from the file headers,
    at 2 bytes each in bfloat16 whatever they were saved in."""
    target = make_tiny_checkpoint(tmp_path / "t", overrides={"num_hidden_layers": 2})
    model = Qwen3ForCausalLM(ModelConfig.from_folder(target), choose_kernel_backends(torch.device("cpu")))
    params = sum(p.numel() for p in model.parameters())
    assert checkpoint_bytes(target, torch.bfloat16) == 2 * params
    draft = make_tiny_dflash_checkpoint(tmp_path / "d", target, target_layer_ids=(0,))
    assert 0 < checkpoint_bytes(draft, torch.float32) < checkpoint_bytes(target, torch.float32)


def test_which_flag_sizes_the_cache(tmp_path: Path) -> None:
    """--num-kv-blocks wins, then --kv-cache-gb (also on CUDA), then the GPU share on CUDA (the CLI's default,
    kv_cache_gb None); the CPU without either takes 1 GiB and ignores --gpu-memory-utilization."""
    target = make_tiny_checkpoint(tmp_path / "t")
    model = ModelConfig.from_folder(target)
    block = 1 << 20  # 1 MiB a block, for round numbers

    def blocks(gpu: GpuMemory | None, **flags: object) -> int:
        config = EngineConfig(model_path=target, served_model_name="t", **flags)  # type: ignore[arg-type]
        return num_kv_blocks(config, model, torch.float32, block, gpu)

    assert blocks(H200, num_kv_blocks=7, kv_cache_gb=2.0) == 7
    assert blocks(H200, kv_cache_gb=2.0) == 2048
    assert (
        blocks(None, kv_cache_gb=None) == blocks(None, kv_cache_gb=None, gpu_memory_utilization=0.1) == 1024
    )
    assert blocks(H200) == 1024  # a config made in code (tests, benchmarks) keeps 1 GiB unless told
    weights = checkpoint_bytes(target, torch.float32)
    activations = activation_bytes(model, 512, 64, 0, torch.float32)
    expected = (int(0.5 * H200.total) - weights - activations - CUDA_RESERVE_BYTES) // block
    assert blocks(H200, kv_cache_gb=None, gpu_memory_utilization=0.5) == expected


def test_a_start_time_dflash_drafter_is_counted(tmp_path: Path) -> None:
    """With --spec-method dflash at start the drafter's weights and K's sampled rows come off the share."""
    target = make_tiny_checkpoint(tmp_path / "t")
    draft = make_tiny_dflash_checkpoint(tmp_path / "d", target, target_layer_ids=(0,))
    model = ModelConfig.from_folder(target)
    plain = EngineConfig(model_path=target, served_model_name="t", kv_cache_gb=None)
    spec = DrafterSpec("dflash", 7, draft)
    drafting = EngineConfig(model_path=target, served_model_name="t", kv_cache_gb=None, speculative=spec)
    extra = checkpoint_bytes(draft, torch.float32)
    extra += activation_bytes(model, 512, 64, 7, torch.float32) - activation_bytes(
        model, 512, 64, 0, torch.float32
    )
    kv = [num_kv_blocks(c, model, torch.float32, 1, H200) for c in (plain, drafting)]
    assert kv[0] - kv[1] == extra


def test_a_block_holds_the_targets_page_and_the_drafters(tmp_path: Path) -> None:
    """A page is keys and values for every layer (2 * layers * kv_heads * head_dim * tokens * bytes); with a
    start-time DFlash drafter a block is the target's page and the drafter's context-cache page. The engine
    loaded with --kv-cache-gb 0.01 holds as many blocks as fit, and allocates them: the target's pages (one
    scratch page past them) and the drafter's."""
    target = make_tiny_checkpoint(tmp_path / "t")
    draft = make_tiny_dflash_checkpoint(tmp_path / "d", target, num_layers=2, target_layer_ids=(0,))
    model = ModelConfig.from_folder(target)
    assert page_bytes(model, 16, torch.bfloat16) == 2 * 4 * 2 * 64 * 16 * 2  # 4 layers, 2 KV heads of 64
    spec = DrafterSpec("dflash", 7, draft)
    config = EngineConfig(model_path=target, served_model_name="t", kv_cache_gb=0.01, speculative=spec)
    plain = EngineConfig(model_path=target, served_model_name="t", kv_cache_gb=0.01)
    drafter_page = page_bytes(ModelConfig.from_folder(draft), config.block_size, torch.float32)
    block = kv_block_bytes(config, model, torch.float32)
    assert block == kv_block_bytes(plain, model, torch.float32) + drafter_page
    runner = load_runner(config)
    n = runner.num_kv_blocks
    assert n == int(0.01 * GIB) // block and n * block <= 0.01 * GIB < (n + 1) * block
    drafter = SpecDecoder(spec, runner, None).drafter
    target_bytes = sum(c.numel() * c.element_size() for c in runner.kv_caches)  # type: ignore[attr-defined]
    drafter_bytes = sum(c.numel() * c.element_size() for c in drafter.context_caches)  # type: ignore[attr-defined]
    assert (target_bytes, drafter_bytes) == ((n + 1) * (block - drafter_page), n * drafter_page)


def test_the_cli_sizes_by_the_gpu_share_unless_told() -> None:
    """openinfer-engine (and openinfer-serve) without --kv-cache-gb leaves it to --gpu-memory-utilization."""
    assert config_from_args(parse_args([])).kv_cache_gb is None
    assert config_from_args(parse_args(["--kv-cache-gb", "2"])).kv_cache_gb == 2.0
    assert config_from_args(parse_args(["--gpu-memory-utilization", "0.5"])).gpu_memory_utilization == 0.5


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_ranks_state_slot_is_what_its_deltanet_layers_allocate(tmp_path: Path, world_size: int) -> None:
    """Under tensor parallelism a hybrid model's state slot is sized as one rank allocates it (its q/k/v
    channels and value heads): the bytes of rank 1's DeltaNet states, per slot; half of one rank's at N = 2."""
    folder = make_tiny_qwen3_5_checkpoint(tmp_path / "q", seed=0)
    model = ModelConfig.from_folder(folder)
    parallel = TensorParallel(world_size - 1, world_size)
    runner = ModelRunner(folder, torch.device("cpu"), 8, 4, dtype=torch.float32, parallel=parallel)
    assert runner.state_geometry is not None and isinstance(runner.model, Qwen3_5ForCausalLM)
    allocated = sum(layer.state_bytes for layer in runner.model.linear_layers)
    assert state_slot_bytes(model, torch.float32, world_size) == allocated
    assert state_slot_bytes(model, torch.float32, 2) * 2 == state_slot_bytes(model, torch.float32)


def test_the_gpu_share_holds_a_ranks_slice_of_the_weights(tmp_path: Path) -> None:
    """On CUDA each rank's --gpu-memory-utilization share holds its slice of the target's weights (1 / N of
    the checkpoint), so at N = 2 a rank's KV cache gains half the weights' bytes."""
    target = make_tiny_checkpoint(tmp_path / "t")
    model = ModelConfig.from_folder(target)
    one, two = (
        EngineConfig(model_path=target, served_model_name="t", kv_cache_gb=None, tensor_parallel_size=n)
        for n in (1, 2)
    )
    weights = checkpoint_bytes(target, torch.float32)
    blocks = [num_kv_blocks(config, model, torch.float32, 1, H200) for config in (one, two)]
    assert blocks[1] - blocks[0] == weights - weights // 2
