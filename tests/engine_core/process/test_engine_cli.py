"""openinfer-engine's flags that reach the model runner."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from openinfer.engine_core.config import Device, DeviceKind, EngineConfig, ModelDtype
from openinfer.engine_core.process.engine_args import num_threads
from openinfer.engine_core.process.engine_cli import config_from_args, parse_args
from openinfer.kernels.backend_name import BackendName


@pytest.mark.parametrize("backend", ["auto", "torch", "triton", "flash_attn"])
def test_attention_backend_flag(backend: str) -> None:
    """--attention-backend lands in EngineConfig as given; auto when absent."""
    assert config_from_args(parse_args([])).attention_backend == "auto"
    config = config_from_args(parse_args(["--attention-backend", backend]))
    assert config.attention_backend == backend and type(config.attention_backend) is BackendName


def test_unknown_attention_backend_is_refused() -> None:
    """The CLI and the config both refuse a backend that does not exist, naming the flag."""
    with pytest.raises(SystemExit):
        parse_args(["--attention-backend", "xformers"])
    with pytest.raises(ValueError, match="--attention-backend must be one of"):
        EngineConfig(model_path=Path("/m"), served_model_name="m", attention_backend="xformers")


def test_device_and_dtype_flags_become_typed_values() -> None:
    """--gpu N, --device and --dtype (vLLM's half too) reach the config as a Device and a ModelDtype."""
    assert config_from_args(parse_args([])).device == Device(DeviceKind.CPU, 0)
    assert config_from_args(parse_args(["--gpu", "3"])).device == Device(DeviceKind.CUDA, 3)
    assert config_from_args(parse_args(["--device", "cuda"])).device == Device(DeviceKind.CUDA, 0)
    config = config_from_args(parse_args(["--dtype", "half"]))
    assert config.dtype is ModelDtype.FLOAT16


@pytest.mark.parametrize(
    ("text", "device"),
    [("cpu", Device()), ("cuda", Device(DeviceKind.CUDA)), ("cuda:2", Device(DeviceKind.CUDA, 2))],
)
def test_device_parses_and_prints_torch_spelling(text: str, device: Device) -> None:
    """Device.parse reads torch's spelling and str gives it back (cuda reads as cuda:0)."""
    assert Device.parse(text) == device
    assert str(device) == ("cuda:0" if text == "cuda" else text)


@pytest.mark.parametrize("text", ["gpu", "cpu:1", "cuda:x", "cuda:-1", ""])
def test_device_refuses_what_torch_would_not_run(text: str) -> None:
    """A device that is not cpu or cuda:N is refused with the spelling it needs."""
    with pytest.raises(ValueError, match="cpu"):
        Device.parse(text)


def test_tensor_parallel_flags_reach_the_config() -> None:
    """-tp N (vLLM's name) with N CPU ranks, or one GPU per rank from --gpu 0,1 or --device cuda (the first N
    visible devices); 1 by default. Every drafter (n-gram with adaptive verification, DFlash, DSpark) is taken
    at N > 1."""
    assert config_from_args(parse_args([])).tensor_parallel_size == 1
    cpu = config_from_args(parse_args(["-tp", "2"]))
    assert (cpu.tensor_parallel_size, cpu.rank_devices) == (2, (Device(), Device()))
    gpus = config_from_args(parse_args(["--tensor-parallel-size", "2", "--gpu", "2,5"]))
    assert gpus.device == Device(DeviceKind.CUDA, 2)
    assert gpus.rank_devices == (Device(DeviceKind.CUDA, 2), Device(DeviceKind.CUDA, 5))
    visible = config_from_args(parse_args(["-tp", "2", "--device", "cuda"]))
    assert visible.rank_devices == (Device(DeviceKind.CUDA, 0), Device(DeviceKind.CUDA, 1))
    ngram = ["--spec-method", "ngram", "--num-spec-tokens", "3", "--enable-adaptive-verification"]
    spec = config_from_args(parse_args(["-tp", "2", *ngram])).speculative  # n-gram runs at any N
    assert spec is not None and (spec.method, spec.adaptive_verification) == ("ngram", True)
    for method in ("dflash", "dspark"):  # every drafter runs at any N (a block drafter on rank 0)
        drafter = ["--spec-method", method, "--num-spec-tokens", "3", "--draft-model", "/d"]
        spec = config_from_args(parse_args(["-tp", "2", *drafter])).speculative
        assert spec is not None and (spec.method, spec.draft_model) == (method, Path("/d"))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-tp", "0"], "--tensor-parallel-size must be >= 1, got 0"),
        (["-tp", "2", "--gpu", "0"], "--gpu names 1 device(s) for --tensor-parallel-size 2"),
        (["--gpu", "0,1"], "--gpu names 2 device(s) for --tensor-parallel-size 1"),
        (["-tp", "2", "--fake-model"], "--fake-model has no model to shard"),
        (["-tp", "2", "--rank-timeout", "0"], "--rank-timeout must be positive"),
    ],
)
def test_tensor_parallel_refusals_name_the_flags(argv: list[str], words: str) -> None:
    """What tensor parallelism cannot run (yet) is refused at start, naming the flags."""
    with pytest.raises(ValueError, match=re.escape(words)):
        config_from_args(parse_args(argv))


@pytest.mark.parametrize("text", ["x", "0,0", "-1", "0,,1"])
def test_gpu_list_refuses_what_is_no_device_list(text: str) -> None:
    """--gpu takes distinct indices >= 0, comma-separated: anything else is a usage error."""
    with pytest.raises(SystemExit):
        parse_args(["--gpu", text])


def test_each_cpu_rank_gets_its_share_of_the_cores() -> None:
    """--num-threads, else 1 per engine, or with N CPU ranks the cores / N each (2 cores, N = 2: 1)."""
    assert num_threads(parse_args([]), cores=8) == 1
    assert num_threads(parse_args(["-tp", "2"]), cores=8) == 4
    assert num_threads(parse_args(["-tp", "2"]), cores=2) == 1
    assert num_threads(parse_args(["-tp", "4"]), cores=2) == 1
    assert num_threads(parse_args(["-tp", "2", "--num-threads", "3"]), cores=2) == 3
    assert num_threads(parse_args(["-tp", "2", "--device", "cuda"]), cores=8) == 1
