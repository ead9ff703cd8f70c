"""A Triton kernel launch as data, and its compilation for a GPU that need not be present.

The launch code of the Triton backends (triton_attention.py, triton_dflash_attention.py) builds a
:class:`KernelLaunch` and runs it; the compile check (benchmarks/triton_compile.py) builds the same launches
from example tensors and compiles them with :func:`compile_launch` for sm_90 and sm_80, so what it checks is
what the engine launches: the signature, the integer specializations and the constexprs all come from
Triton's own binder applied to the launch's arguments.
"""

from __future__ import annotations

import io
import re
import tempfile
import time
from contextlib import redirect_stdout
from dataclasses import dataclass
from typing import Any

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

# ptxas -v, printed when TRITON_DUMP_PTXAS_LOG is set: "8 bytes spill stores", "Used 255 registers".
SPILL_STORES = re.compile(r"(\d+) bytes spill stores")
REGISTERS = re.compile(r"Used (\d+) registers")


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: ``kernel[grid](*args, **constexprs, num_warps=..., num_stages=...)``."""

    kernel: JITFunction[Any]
    grid: tuple[int, ...]
    args: tuple[object, ...]  # the runtime arguments, in the kernel's order
    constexprs: dict[str, object]  # by name; never mutated after construction
    num_warps: int = 4  # Triton's default
    num_stages: int = 3  # Triton's default: loads in flight in a pipelined loop
    max_registers: int | None = None  # per-thread cap for ptxas (Triton's maxnreg); None: ptxas chooses

    def run(self) -> None:
        self.kernel[self.grid](*self.args, **self.options)

    @property
    def options(self) -> dict[str, object]:
        """The keyword arguments of the launch: constexprs and launch options."""
        options = {**self.constexprs, "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.max_registers is not None:
            options["maxnreg"] = self.max_registers
        return options


@dataclass(frozen=True)
class CompiledLaunch:
    """What ptxas and Triton report for one launch compiled for one target."""

    registers: int  # per thread
    spill_bytes: int  # ptxas "spill stores"
    shared_bytes: int  # dynamic shared memory the launch asks for
    seconds: float


def compile_launch(launch: KernelLaunch, capability: int) -> CompiledLaunch:
    """Compiles ``launch`` for ``sm_<capability>`` to a cubin, exactly as a launch on that GPU would
    specialize it; raises on a compile error."""
    if knobs.runtime.interpret:
        raise RuntimeError("compile_launch needs TRITON_INTERPRET unset: the interpreter compiles nothing")
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    fn = launch.kernel
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = launch.options
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, kwargs, bound_args, specialization, options
    )
    log = io.StringIO()
    start = time.perf_counter()
    # A cache of its own (a hit would skip ptxas, whose -v log is where registers and spills come from).
    with tempfile.TemporaryDirectory() as cache_dir, knobs.cache.scope(), knobs.nvidia.scope():
        knobs.cache.dir, knobs.nvidia.dump_ptxas_log = cache_dir, True
        with redirect_stdout(log):
            kernel = triton.compile(
                ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__
            )
    seconds = time.perf_counter() - start
    registers, spills = REGISTERS.search(log.getvalue()), SPILL_STORES.search(log.getvalue())
    if registers is None or spills is None:
        raise RuntimeError(f"ptxas -v printed no register or spill counts:\n{log.getvalue()}")
    return CompiledLaunch(int(registers.group(1)), int(spills.group(1)), kernel.metadata.shared, seconds)
