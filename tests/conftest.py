"""Without CUDA, Triton kernels run under Triton's interpreter (numpy, on the CPU): tests/kernels checks the
paged-attention kernels that way.

TRITON_INTERPRET must be set before triton is first imported, not only before our kernels are defined:
`@triton.jit` picks the interpreter when it decorates, triton.language's own jit helpers (tl.max, tl.sum,
tl.cdiv) included, and transformers' Qwen3 imports triton. So it is set here, before any test module loads.
On the CPU nothing else runs Triton, so the rest of the suite (and the processes it starts) is unaffected.
"""

import os
from pathlib import Path

import pytest
import torch

from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The served tests' small checkpoint (e2e, benchmarks): the built-in tokenizer's vocabulary, so text
    prompts work end to end, and 256 positions."""
    overrides = {**SMALL_TEXT_QWEN3, "max_position_embeddings": 256}
    return make_tiny_checkpoint(tmp_path_factory.mktemp("model") / "tiny", seed=3, overrides=overrides)
