"""``-O`` and ``--compilation-config``: vLLM's flags for compiling the model step with torch.compile (no torch).

vLLM's levels: 0 runs the model eagerly; 1, 2 and 3 compile it (vLLM's 3, its default, is its own piecewise
pipeline; openinfer compiles one graph of the whole decoder stack at each of them, so they are the same
here). ``--enforce-eager`` means no compile and no CUDA graphs, whatever the level. The JSON's keys are
vLLM's; a key openinfer does not have is refused by name, never ignored.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

# The level an engine runs without -O or --compilation-config (README "Compiled model step" says why).
DEFAULT_LEVEL = 0
MAX_LEVEL = 3


class CompilationConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """vLLM's ``--compilation-config`` keys that openinfer has."""

    level: int | None = None  # 0: eager; 1-3: compiled (vLLM's name before 0.11)
    mode: int | None = None  # vLLM's newer name for the level
    cache_dir: str | None = None  # where compiled artifacts are kept (default: a per-user cache folder)

    def __post_init__(self) -> None:
        for name, value in (("level", self.level), ("mode", self.mode)):
            if value is not None and not 0 <= value <= MAX_LEVEL:
                raise ValueError(f"{name} must be 0 (eager) to {MAX_LEVEL} (compiled), got {value}")
        if self.level is not None and self.mode is not None and self.level != self.mode:
            raise ValueError(f"level {self.level} and mode {self.mode} disagree: give one of them")

    @property
    def compiles(self) -> bool:
        """Whether the model step is compiled (a level of 1 or more)."""
        level = self.mode if self.mode is not None else self.level
        return (DEFAULT_LEVEL if level is None else level) > 0

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
