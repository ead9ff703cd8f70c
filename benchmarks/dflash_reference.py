"""openinfer's DFlash rounds against z-lab's reference `dflash_generate`, prompt by prompt; not a test.

Both run greedy on the same target and drafter folders (z-lab's layout: `sample_from_anchor` false or
absent), K = block_size - 1 unless `--num-spec-tokens`, prompts cut from a text file with the target's
tokenizer. One row a prompt: rounds and accepted drafts on each side, and whether tokens and every round's
accepted count are equal (`openinfer.engine_core.testing.zlab_reference` says how rounds are matched):

    python -m openinfer.benchmarks.dflash_reference --draft-model DRAFTER [--dataset-path TEXT] \\
        --num-prompts 8 --max-tokens 48

TEXT defaults to the built-in tinyshakespeare.

Needs the `dflash` package (`pip install -e '.[test]'`).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from tokenizers import Tokenizer

from openinfer.engine_core.builtin_model import builtin_target_folder, builtin_text_path
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.testing.zlab_reference import openinfer_runs, reference_runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=None, help="target folder (default: the built-in)")
    parser.add_argument("--draft-model", type=Path, required=True, help="DFlash drafter in z-lab's layout")
    parser.add_argument("--num-spec-tokens", type=int, default=None, help="K (default: block_size - 1)")
    parser.add_argument(
        "--dataset-path",
        type=Path,
        default=builtin_text_path(),
        help="text to cut prompts from (default: the built-in tinyshakespeare)",
    )
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt tokens")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    target = args.model or builtin_target_folder()
    k = args.num_spec_tokens or DFlashConfig.from_folder(args.draft_model).block_size - 1
    ids = Tokenizer.from_file(str(target / "tokenizer.json")).encode(args.dataset_path.read_text()).ids
    rng = random.Random(args.seed)
    starts = [rng.randrange(len(ids) - args.prompt_len) for _ in range(args.num_prompts)]
    prompts = [ids[s : s + args.prompt_len] for s in starts]
    max_tokens = [args.max_tokens] * len(prompts)
    reference = reference_runs(target, args.draft_model, k, prompts, max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        ours = openinfer_runs(target, args.draft_model, k, prompts, max_tokens, Path(tmp) / "spec.jsonl")

    print(
        f"K={k}, {len(prompts)} prompts of {args.prompt_len} tokens, {args.max_tokens} output tokens, greedy"
    )
    print()
    print(
        "| prompt | z-lab rounds | of which last-token | openinfer rounds | z-lab accepted | openinfer accepted "
        "| tokens equal | rounds equal |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|---|")
    totals = [0, 0, 0, 0, 0]
    for i, (ref, mine) in enumerate(zip(reference, ours, strict=True)):
        row = [
            len(ref.rounds) + ref.final_rounds,
            ref.final_rounds,
            len(mine.rounds),
            sum(ref.rounds),
            sum(mine.rounds),
        ]
        totals = [t + r for t, r in zip(totals, row, strict=True)]
        same = (mine.tokens == ref.tokens, mine.rounds == ref.rounds)
        print(
            f"| {i} | "
            + " | ".join(map(str, row))
            + f" | {'yes' if same[0] else 'NO'} | {'yes' if same[1] else 'NO'} |"
        )
    print("| all | " + " | ".join(map(str, totals)) + " | | |")
    rounds, accepted = totals[2], totals[4]
    if rounds:
        print(
            f"\nopeninfer: {accepted / rounds:.3f} accepted drafts per round, mean acceptance length "
            f"{1 + accepted / rounds:.3f}"
        )


if __name__ == "__main__":
    main()
