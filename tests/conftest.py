"""Without CUDA, Triton kernels run under Triton's interpreter (numpy, on the CPU): tests/kernels checks the
paged-attention kernels that way.

TRITON_INTERPRET must be set before triton is first imported, not only before our kernels are defined:
`@triton.jit` picks the interpreter when it decorates, triton.language's own jit helpers (tl.max, tl.sum,
tl.cdiv) included, and transformers' Qwen3 imports triton. So it is set here, before any test module loads.
On the CPU nothing else runs Triton, so the rest of the suite (and the processes it starts) is unaffected.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
