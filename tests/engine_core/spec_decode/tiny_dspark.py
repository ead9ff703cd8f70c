"""The tiny DSpark drafter the DSpark tests share: its checkpoint over plain_dflash's 3-layer target (layers 0
and 1 feed it), the KV pages it runs on, and PyPI speculators' heads to check it against."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from openinfer.engine_core.models.dspark_heads import MarkovHeadType
from openinfer.engine_core.testing.deepspec_reference import speculators_dspark_heads
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from tests.engine_core.spec_decode.plain_dflash import LAYER_IDS

PAGE, NUM_PAGES = 4, 48
HEAD_TYPES = list(MarkovHeadType)


def speculators_heads() -> ModuleType:
    """speculators' DSpark heads (MarkovHead, ConfidenceHead), loaded from their file."""
    module = speculators_dspark_heads()
    if module is None:
        pytest.skip(
            "PyPI speculators is not installed: `pip install --no-deps speculators==0.9.0` (its declared "
            "dependencies pin an older transformers; the heads need only torch)"
        )
    return module


def dspark_checkpoint(
    folder: Path, target: Path, head_type: MarkovHeadType, block_size: int = 6, markov_rank: int = 8
) -> Path:
    return make_tiny_dspark_checkpoint(
        folder,
        target,
        seed=2,
        num_layers=2,
        block_size=block_size,
        target_layer_ids=LAYER_IDS,
        markov_rank=markov_rank,
        markov_head_type=head_type,
        init_std=0.3,
    )
