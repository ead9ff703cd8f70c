"""The engine process's configuration: one frozen dataclass, validated once."""

from __future__ import annotations

import argparse
import dataclasses
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from openinfer.engine_core.compilation_config import CompilationConfig
from openinfer.engine_core.kv_events_config import KVEventsConfig
from openinfer.kernels.backend_name import BackendName
from openinfer.protocol import DFlashAnchor, DrafterMethod
from openinfer.protocol.addresses import engine_addresses

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")
DEFAULT_CPU_KV_CACHE_GB = 1.0  # the KV cache on the CPU without --kv-cache-gb


class SpecMethod(enum.StrEnum):
    """``--spec-method``: the drafters an engine can load (protocol's ``DrafterMethod`` on the wire)."""

    NGRAM = "ngram"
    DFLASH = "dflash"
    DSPARK = "dspark"


# The block drafters: a checkpoint folder (--draft-model) that reads the target's hidden states.
CHECKPOINT_METHODS = frozenset({SpecMethod.DFLASH, SpecMethod.DSPARK})


class ModelDtype(enum.StrEnum):
    """``--dtype``: the weights' and KV cache's; auto is float32 on the CPU (exact parity with transformers)
    and bfloat16 on CUDA (``worker/executor.py`` ``resolve_dtype``)."""

    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class DeviceKind(enum.StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


def check_kv_geometry(num_kv_blocks: int, block_size: int) -> None:
    """Refuse a KV cache without a block, or blocks without a slot, saying which flags set them."""
    if num_kv_blocks < 1 or block_size < 1:
        raise ValueError(
            "a KV cache needs at least one block of at least one slot: --num-kv-blocks (or the memory "
            f"--kv-cache-gb buys) and --block-size must be >= 1, got {num_kv_blocks} blocks of {block_size}"
        )


@dataclass(frozen=True)
class Device:
    """Where an engine runs: the CPU, or CUDA device ``index`` (``--gpu N``)."""

    kind: DeviceKind = DeviceKind.CPU
    index: int = 0  # the GPU's index; always 0 on the CPU

    def __post_init__(self) -> None:
        if self.index < 0 or (self.kind is DeviceKind.CPU and self.index):
            raise ValueError(f"device index must be >= 0 (and 0 on the CPU), got {self.kind}:{self.index}")

    @classmethod
    def parse(cls, text: str) -> Device:
        """``cpu``, ``cuda`` or ``cuda:N`` (torch's spelling)."""
        kind, _, index = text.partition(":")
        if kind not in set(DeviceKind) or (index and (kind != DeviceKind.CUDA or not index.isdigit())):
            raise ValueError(f"device must be 'cpu' or 'cuda:N', got {text!r}")
        return cls(DeviceKind(kind), int(index or 0))

    def __str__(self) -> str:
        """torch's spelling: ``cpu`` or ``cuda:N``."""
        return "cpu" if self.kind is DeviceKind.CPU else f"cuda:{self.index}"


@dataclass(frozen=True)
class DrafterSpec:
    """What to load: ``--spec-method``, ``--num-spec-tokens`` and the method's options."""

    method: DrafterMethod
    num_spec_tokens: int  # K, in [1, MAX_SPEC_TOKENS]; refused (never clamped) outside
    draft_model: Path | None = None  # DFlash or DSpark checkpoint folder
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    dflash_anchor: DFlashAnchor | None = None  # None: read from the checkpoint's config
    # dspark (--confidence-threshold): verify a round's drafts up to the first whose confidence is below it
    # (DeepSpec's rule, per position); 0 verifies every draft proposed
    confidence_threshold: float = 0.0
    # --enable-adaptive-verification: each step verifies the drafts whose expected accepted tokens pay for
    # their cost (spec_decode/adaptive.py), with the step costs the engine measures at start
    adaptive_verification: bool = False

    def __post_init__(self) -> None:
        if self.method in CHECKPOINT_METHODS and self.draft_model is None:
            raise ValueError(
                f"{self.method} needs a checkpoint folder (--draft-model PATH; `draft_model` in a run-time "
                "load): only the built-in target brings its own drafters"
            )
        if not 0.0 <= self.confidence_threshold <= 1.0:
            raise ValueError(f"--confidence-threshold must be in [0, 1], got {self.confidence_threshold}")
        if self.confidence_threshold and self.method != SpecMethod.DSPARK:
            raise ValueError(
                "--confidence-threshold needs --spec-method dspark: only DSpark's confidence head sets how "
                "many drafts are verified"
            )


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine process is told at start; facts found at run time live elsewhere."""

    model_path: Path  # Hugging Face-format Qwen3 folder
    served_model_name: str  # the name clients ask for (vLLM: --served-model-name, else --model as given)
    device: Device = Device()  # the CPU, or a CUDA device
    dtype: ModelDtype = ModelDtype.AUTO  # weights and KV cache (auto: float32 on the CPU, bfloat16 on CUDA)
    engine_index: int = 0  # this engine's index behind the frontend (one per GPU)
    # The frontends' ROUTERs (each one's PULL is on the next port); the first exports this engine's metrics.
    frontend_addresses: tuple[str, ...] = ("tcp://127.0.0.1:5555",)
    # KV cache GiB; None (the CLI's default): gpu_memory_utilization's share on CUDA, 1 GiB on the CPU
    kv_cache_gb: float | None = DEFAULT_CPU_KV_CACHE_GB
    gpu_memory_utilization: float = 0.9  # CUDA: this engine's fraction of the GPU (vLLM's flag)
    num_kv_blocks: int | None = None  # exact KV block count (tests use it to force preemption)
    block_size: int = 16  # tokens per KV block
    attention_backend: BackendName = BackendName.AUTO  # auto: triton on CUDA, torch on the CPU
    max_num_seqs: int = 64  # most requests running at once
    max_num_batched_tokens: int = 512  # token budget per step (chunked prefill above it)
    max_model_len: int | None = None  # prompt + output limit; None: the model's max_position_embeddings
    seed: int = 0  # the global sampler seed for requests without their own
    heartbeat_interval: float = 0.5  # seconds between messages when idle (docs/design.md: at most 1 s)
    speculative: DrafterSpec | None = None  # the drafter loaded at start; None: no speculation
    # Drafters by method for a load that names no folder (the built-in target's: it brings its own)
    default_draft_models: dict[str, Path] = dataclasses.field(default_factory=dict)
    spec_log: Path | None = None  # --spec-log: one JSON line per draft
    fake_model: bool = (
        False  # --fake-model: no weights, cheap deterministic logits (worker/fake_model_runner.py)
    )
    step_sleep: float = 0.0  # --step-sleep: seconds slept after each step that ran requests (a slowed engine)
    curve_keys: Path | None = None  # --zmq-curve-keys: CurveZMQ keys folder made by openinfer-keys
    enforce_eager: bool = False  # --enforce-eager: no CUDA graphs (vLLM's flag)
    enable_prefix_caching: bool = True  # --no-enable-prefix-caching: every prompt computed (vLLM's flag)
    allowed_drafter_dirs: tuple[Path, ...] = ()  # run-time drafters must lie under one; none: no path loads
    # --tensor-parallel-size N: ranks the model is sharded over (this process is rank 0; worker/parallel/rank_group.py)
    tensor_parallel_size: int = 1
    # each rank's device in rank order, rank 0's being `device`; () fills it in: the CPU for every rank, or
    # CUDA devices device.index, device.index + 1, ...
    rank_devices: tuple[Device, ...] = ()
    rank_timeout: float = 60.0  # --rank-timeout: seconds a rank may keep the others waiting inside a step
    enable_expert_parallel: bool = False  # --enable-expert-parallel: MoE experts split whole over the ranks
    kv_events_config: KVEventsConfig | None = None  # --kv-events-config: publish the prefix cache's changes
    # -O / --compilation-config: the model step compiled with torch.compile (level 1-3) or eager (0)
    compilation: CompilationConfig = CompilationConfig()

    def __post_init__(self) -> None:
        if self.engine_index < 0:
            raise ValueError(f"--engine-index must be >= 0, got {self.engine_index}")
        if self.kv_cache_gb is not None and not self.kv_cache_gb > 0:
            raise ValueError(f"--kv-cache-gb must be positive, got {self.kv_cache_gb}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        check_kv_geometry(1 if self.num_kv_blocks is None else self.num_kv_blocks, self.block_size)
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("--max-num-seqs and --max-num-batched-tokens must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"--max-model-len must be >= 2, got {self.max_model_len}")
        if not 0 < self.heartbeat_interval <= 1.0:
            raise ValueError("the heartbeat interval must be in (0, 1] seconds")
        if self.dtype not in set(ModelDtype):
            raise ValueError(f"--dtype must be one of {', '.join(ModelDtype)}, got {self.dtype!r}")
        if self.attention_backend not in set(BackendName):
            raise ValueError(
                f"--attention-backend must be one of {', '.join(BackendName)}, got {self.attention_backend!r}"
            )
        # The flags' strings become their enums here, once (a StrEnum member equals its string).
        object.__setattr__(self, "dtype", ModelDtype(self.dtype))
        object.__setattr__(self, "attention_backend", BackendName(self.attention_backend))
        if not self.step_sleep >= 0:
            raise ValueError(f"--step-sleep must be >= 0 seconds, got {self.step_sleep}")
        spec = self.speculative
        if self.fake_model and spec is not None and spec.method in CHECKPOINT_METHODS:
            raise ValueError(f"--fake-model has no hidden states for {spec.method}; use --spec-method ngram")
        self._check_ranks()
        if self.publishes_kv_events and not self.enable_prefix_caching:
            raise ValueError(
                "--kv-events-config publishes the prefix cache's changes: drop --no-enable-prefix-caching"
            )
        object.__setattr__(self, "frontend_addresses", tuple(self.frontend_addresses))
        if not self.frontend_addresses:
            raise ValueError("--frontend needs at least one tcp://HOST:PORT")
        for address in self.frontend_addresses:
            engine_addresses(address)  # ValueError naming it when it is not tcp://HOST:PORT
        if len(set(self.frontend_addresses)) != len(self.frontend_addresses):
            raise ValueError(f"--frontend names an address twice: {' '.join(self.frontend_addresses)}")

    def _check_ranks(self) -> None:
        """Refuse what tensor parallelism cannot run yet, and fill in each rank's device."""
        size = self.tensor_parallel_size
        if size < 1:
            raise ValueError(f"--tensor-parallel-size must be >= 1, got {size}")
        if not self.rank_timeout > 0:
            raise ValueError(f"--rank-timeout must be positive seconds, got {self.rank_timeout}")
        if size > 1 and self.fake_model:
            raise ValueError("--fake-model has no model to shard: drop --tensor-parallel-size")
        devices = self.rank_devices or tuple(
            self.device
            if self.device.kind is DeviceKind.CPU
            else Device(DeviceKind.CUDA, self.device.index + r)
            for r in range(size)
        )
        object.__setattr__(self, "rank_devices", tuple(devices))
        if len(devices) != size or devices[0] != self.device:
            shown = ", ".join(map(str, devices))
            raise ValueError(
                f"--tensor-parallel-size {size} needs one device per rank, rank 0's first: got {shown} "
                f"(--gpu names {size} GPUs, as --gpu 0,1)"
            )
        if any(d.kind is not self.device.kind for d in devices) or (
            self.device.kind is DeviceKind.CUDA and len(set(devices)) != size
        ):
            raise ValueError(f"a tensor-parallel engine's ranks need {size} distinct GPUs, or the CPU each")

    @property
    def publishes_kv_events(self) -> bool:
        return self.kv_events_config is not None and self.kv_events_config.publishes

    @property
    def frontend_address(self) -> str:
        """The metrics frontend's ROUTER: the first ``--frontend``."""
        return self.frontend_addresses[0]

    @property
    def output_address(self) -> str:
        """The metrics frontend's PULL socket (``protocol/addresses.py``: the port after its ROUTER's)."""
        return engine_addresses(self.frontend_address).outputs


def from_flags(config_type: type[C], args: argparse.Namespace, **values: Any) -> C:
    """A ``config_type`` dataclass from the parsed flags whose ``dest`` is one of its fields; ``values`` are
    the fields the flags do not give as they are (they win over a flag of the same name)."""
    names = {field.name for field in dataclasses.fields(config_type)}
    flags = {name: value for name, value in vars(args).items() if name in names}
    return config_type(**{**flags, **values})
