"""openinfer-engine's flags that reach the model runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer.engine_core.config import Device, DeviceKind, EngineConfig, ModelDtype
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
