"""``-O`` and ``--compilation-config``: vLLM's flags for compiling the model step with torch.compile (no torch).

vLLM's levels: 0 runs the model eagerly; 1, 2 and 3 compile it (vLLM's 3, its default, is its own piecewise
pipeline; openinfer compiles one graph of the whole decoder stack at each of them, so they are the same
here). ``--enforce-eager`` means no compile and no CUDA graphs, whatever the level. The JSON's keys are
vLLM's; a key openinfer does not have is refused by name, never ignored.

CUDA graphs (``cudagraph_capture_sizes``, ``max_cudagraph_capture_size``, ``cudagraph_mode``) are openinfer's
full graphs of decode and verify steps, one per padded batch of requests (worker/step_graphs.py), the same at
every level; prefill and mixed steps run outside them. ``compile_sizes`` are token counts that get a graph of
their own, specialised to that count, beside the dynamic one.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

# The level an engine runs without -O or --compilation-config (README "Compiled model step" says why).
DEFAULT_LEVEL = 0
MAX_LEVEL = 3
# Requests per padded decode/verify step captured when the config names no sizes (vLLM captures 1, 2, 4,
# then steps of 8 and 16; openinfer's steps are coarser past 16: each bucket is a graph to capture).
DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# vLLM's cudagraph_mode values; NONE captures nothing, every other one openinfer's full decode/verify graphs.
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


class CompilationConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """vLLM's ``--compilation-config`` keys that openinfer has."""

    level: int | None = None  # 0: eager; 1-3: compiled (vLLM's name before 0.11)
    mode: int | None = None  # vLLM's newer name for the level
    cache_dir: str | None = None  # where compiled artifacts are kept (default: a per-user cache folder)
    compile_sizes: list[int] | None = None  # token counts compiled into graphs of their own (compiled levels)
    cudagraph_capture_sizes: list[int] | None = None  # requests per captured decode/verify step (CUDA)
    max_cudagraph_capture_size: int | None = None  # the largest of them (default sizes trimmed to it)
    cudagraph_mode: str | None = None  # one of CUDAGRAPH_MODES; NONE: no CUDA graphs

    def __post_init__(self) -> None:
        for name, value in (("level", self.level), ("mode", self.mode)):
            if value is not None and not 0 <= value <= MAX_LEVEL:
                raise ValueError(f"{name} must be 0 (eager) to {MAX_LEVEL} (compiled), got {value}")
        if self.level is not None and self.mode is not None and self.level != self.mode:
            raise ValueError(f"level {self.level} and mode {self.mode} disagree: give one of them")
        for name, sizes in (
            ("compile_sizes", self.compile_sizes),
            ("cudagraph_capture_sizes", self.cudagraph_capture_sizes),
            ("max_cudagraph_capture_size", [self.max_cudagraph_capture_size]),
        ):
            if sizes is not None and any(size is not None and size < 1 for size in sizes):
                raise ValueError(f"{name} must be positive, got {sizes}")
        if self.cudagraph_mode is not None and self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(
                f"cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}, got {self.cudagraph_mode!r}"
            )

    @property
    def compiles(self) -> bool:
        """Whether the model step is compiled (a level of 1 or more)."""
        level = self.mode if self.mode is not None else self.level
        return (DEFAULT_LEVEL if level is None else level) > 0

    @property
    def cuda_graphs(self) -> bool:
        """Whether decode and verify steps may run from CUDA graphs (``cudagraph_mode`` other than NONE)."""
        return self.cudagraph_mode != "NONE"

    def capture_sizes(self, max_num_seqs: int) -> tuple[int, ...]:
        """The padded batch sizes captured, ascending: ``cudagraph_capture_sizes`` or the defaults, none past
        ``max_cudagraph_capture_size`` nor past ``max_num_seqs`` (a step of more requests runs eagerly)."""
        sizes = self.cudagraph_capture_sizes or DEFAULT_CAPTURE_SIZES
        largest = min(self.max_cudagraph_capture_size or max(sizes), max(max_num_seqs, 1))
        return tuple(sorted({size for size in sizes if size <= largest}))

    def artifact_dir(self) -> Path:
        """``cache_dir``, else ``$XDG_CACHE_HOME/openinfer/torch_compile`` (``~/.cache`` without it)."""
        if self.cache_dir is not None:
            return Path(self.cache_dir).expanduser()
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(base) / "openinfer" / "torch_compile"


def read_compilation_config(text: str) -> CompilationConfig:
    """``--compilation-config``'s JSON object (or a bare level, as vLLM takes ``-O 3``); ValueError saying
    what is wrong."""
    if text.strip().isdigit():
        text = f'{{"level": {text.strip()}}}'
    try:
        return msgspec.json.decode(text, type=CompilationConfig)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        keys = ", ".join(CompilationConfig.__struct_fields__)
        raise ValueError(f"--compilation-config: {e} (openinfer takes vLLM's keys {keys})") from None


def with_level(config: CompilationConfig | None, level: int | None) -> CompilationConfig:
    """The config ``--compilation-config`` gave with ``-O``'s level over its own (None: no -O)."""
    config = config or CompilationConfig()
    if level is None:
        return config
    return msgspec.structs.replace(config, level=level, mode=None)
