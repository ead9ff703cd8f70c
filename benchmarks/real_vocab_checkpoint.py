"""The real-vocabulary checkpoint the decode benchmarks serve; not a test.

    python -m openinfer.benchmarks.real_vocab_checkpoint [--folder DIR]   # prints the folder

Qwen3-0.6B's widths and its 151,936-token vocabulary (hidden 1024, 16/8 heads, head_dim 128, intermediate
3072, tied embeddings) but 2 layers, random weights (``make_qwen3_0_6b_shaped_checkpoint``, bf16 on disk).
Written once into the temporary folder (under a ``.partial`` name, renamed when complete) and reused by
later runs.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from openinfer.engine_core.testing.qwen3_checkpoint import make_qwen3_0_6b_shaped_checkpoint

NUM_LAYERS = 2  # what runs on a 2-core CPU; the LM head dominates a decode step either way
DEFAULT_FOLDER = Path(tempfile.gettempdir()) / f"openinfer-qwen3-0.6b-shaped-{NUM_LAYERS}-layers"


def real_vocab_checkpoint(folder: Path = DEFAULT_FOLDER) -> Path:
    """The checkpoint's folder, written first unless it exists (it is renamed into place only when complete)."""
    if not (folder / "config.json").is_file():
        partial = folder.with_name(folder.name + ".partial")
        make_qwen3_0_6b_shaped_checkpoint(partial, num_hidden_layers=NUM_LAYERS)
        partial.rename(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER, help="where to write it")
    print(real_vocab_checkpoint(parser.parse_args().folder))


if __name__ == "__main__":
    main()
