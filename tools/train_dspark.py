"""Distil a drafter in DeepSeek's DeepSpec layout from the built-in target: the built-in DSpark drafter, or
(with --markov-rank 0 --no-confidence-head) DeepSpec's DFlash. Run once by the project (after
tools/train_target.py); the output folder is committed as package data.

    python tools/train_dspark.py [TEXT] [--out-dir engine_core/builtin/dspark_block7]
    python tools/train_dspark.py [TEXT] --markov-rank 0 --no-confidence-head \\
        --out-dir engine_core/builtin/dflash_block7 --work-dir runs/train_dflash_block7

TEXT is the training text: by default the tinyshakespeare that ships in `engine_core/builtin/data/`.

1. Data (tools/dflash_data.py): prompts cut from the training part of the text, continued greedily by the
   target to --seq-len tokens (long, so that the drafter sees long contexts: a drafter trained on 192-token
   sequences loses most of its acceptance past them); the target's layer outputs (context features) and its
   final hidden states (its logits, for the L1 term) at every position. Cached in --data-dir, shared by runs.
2. Model: the engine's `DFlashDraftModel` with DeepSpec's heads, trained by tools/dspark_forward.py's forward:
   many blocks per sequence, every slot drafting, the Markov head teacher-forced.
3. Loss: DeepSpec's, 0.1 CE + 0.9 L1 + 1.0 BCE by default (tools/dspark_forward.py).
4. Checks: simulated greedy rounds on held-out sequences of --val-seq-len tokens, binned by output position,
   beside n-gram lookup and the drafters named by --compare; the written folder loaded by the engine must
   propose what the training forward drafts.

Seeded and resumable as tools/train_dflash.py (tools/training.py's loop). Writes config.json,
model.safetensors (with copies of the target's embedding and LM head, as DeepSpec's save_pretrained does) and
README.md, the model card.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from torch import Tensor
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.models.dspark_heads import MarkovHeadType
from openinfer.engine_core.testing.dspark_checkpoint import dspark_checkpoint_config, write_dspark_checkpoint
from openinfer.tools.dflash_card import check_against_engine
from openinfer.tools.dflash_data import (
    DataSpec,
    Distillation,
    distillation_data,
    load_target,
    mask_token,
    target_digest,
)
from openinfer.tools.dflash_forward import Blocks, draft_logits, make_blocks, new_drafter
from openinfer.tools.dspark_card import (
    Measured,
    Proposer,
    deepspec_proposer,
    measure,
    ngram_measured,
    write_card,
)
from openinfer.tools.dspark_forward import AcceptanceLabel, deepspec_loss, held_out_terms, slot_outputs
from openinfer.tools.training import (
    BUILTIN_DIR,
    REPO_ROOT,
    adamw,
    add_training_flags,
    drafter_arg_parser,
    format_minutes,
    start_run,
    train,
)

EVAL_SAMPLES = 8  # held-out sequences measured at each evaluation during training (all of them at the end)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = drafter_arg_parser(__doc__, "dspark_block7", "train_dspark", "the run's checkpoint")
    parser.add_argument(
        "--data-dir", type=Path, default=REPO_ROOT / "runs" / "distill_data", help="greedy sequences, shared"
    )
    parser.add_argument("--num-layers", type=int, default=3, help="draft decoder layers")
    parser.add_argument("--block-size", type=int, default=7, help="draft slots per block = drafts per round")
    parser.add_argument("--target-layer-ids", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--markov-rank", type=int, default=64, help="0: no Markov head (DeepSpec's DFlash)")
    parser.add_argument(
        "--markov-head-type", choices=[t.value for t in MarkovHeadType], default=MarkovHeadType.VANILLA.value
    )
    parser.add_argument("--no-confidence-head", dest="confidence_head", action="store_false")
    parser.add_argument(
        "--acceptance",
        type=AcceptanceLabel,
        choices=list(AcceptanceLabel),
        default=AcceptanceLabel.GREEDY,
        help="the confidence head's label: greedy (argmax match, what temperature 0 accepts) or sampled "
        "(DeepSpec's 1 - TV)",
    )
    parser.add_argument("--ce-weight", type=float, default=0.1)
    parser.add_argument("--l1-weight", type=float, default=0.9)
    parser.add_argument("--bce-weight", type=float, default=1.0)
    parser.add_argument("--num-sequences", type=int, default=768, help="greedy sequences to train on")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per training sequence")
    parser.add_argument("--num-val-sequences", type=int, default=32, help="held-out sequences to measure on")
    parser.add_argument("--val-seq-len", type=int, default=2048, help="tokens per held-out sequence")
    parser.add_argument("--gen-batch", type=int, default=256, help="sequences generated at once")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--anchors", type=int, default=48, help="draft blocks per sequence per step")
    parser.add_argument("--loss-decay", type=float, default=4.0, help="slot k's weight is exp(-k/this)")
    parser.add_argument(
        "--compare", type=Path, nargs="*", default=[BUILTIN_DIR / "dflash"], help="drafters measured beside"
    )
    parser.add_argument(
        "--init-from",
        type=Path,
        help="a drafter of this layout to start from (fine-tuning), not a random one",
    )
    add_training_flags(parser, lr=2e-3, warmup=50, weight_decay=0.01, eval_every=200, checkpoint_every=100)
    args = parser.parse_args(argv)
    args.markov_head_type = MarkovHeadType(args.markov_head_type)
    if args.markov_rank == 0 and args.confidence_head:
        parser.error(
            "a confidence head reads the Markov embedding: with --markov-rank 0 add --no-confidence-head"
        )
    args.method = "dflash" if args.markov_rank == 0 and not args.confidence_head else "dspark"
    args.title = "DSpark drafter" if args.method == "dspark" else "DeepSpec-layout DFlash drafter"
    return args


def folder_proposer(folder: Path, target: Qwen3ForCausalLM, data: Distillation, k: int) -> Proposer:
    """Greedy K-draft proposals of a committed drafter folder (either layout) on `data`."""
    config = DFlashConfig.from_folder(folder)
    model = DFlashDraftModel(config).eval()
    model.load_weights(folder)
    if config.is_deepspec:
        settings = argparse.Namespace(block_size=config.block_size, mask_token_id=config.mask_token_id)
        return deepspec_proposer(model, target, data, settings)

    def propose(i: int, anchors: Tensor) -> tuple[Tensor, Tensor | None]:
        blocks = make_blocks(data.tokens[i : i + 1], anchors, config.block_size, k, config.mask_token_id)
        logits = draft_logits(model, target, data.features[i : i + 1], blocks, config.anchor, k)
        return logits.argmax(-1), None

    return propose


def main() -> None:
    args = parse_args()
    began_all = time.monotonic()
    k = args.block_size  # drafts per round: every slot drafts
    split = start_run(args)
    args.mask_token_id = mask_token(split)
    target = load_target(args.target)
    config = dspark_checkpoint_config(
        ModelConfig.from_folder(args.target),
        num_layers=args.num_layers,
        block_size=k,
        target_layer_ids=tuple(args.target_layer_ids),
        markov_rank=args.markov_rank,
        markov_head_type=args.markov_head_type,
        confidence_head=args.confidence_head,
        confidence_with_markov=args.confidence_head and args.markov_rank > 0,
        mask_token_id=args.mask_token_id,
        num_anchors=args.anchors,
    )
    model = new_drafter(config, args.seed)
    if args.init_from is not None:
        start = json.loads((args.init_from / "config.json").read_text())
        differing = sorted(key for key in config if start.get(key) != config[key])
        if differing:
            raise SystemExit(
                f"--init-from {args.init_from}: its config differs from this run's in {differing}"
            )
        model.load_weights(args.init_from)

    layers = args.target_layer_ids
    train_spec = DataSpec("train", args.num_sequences, args.seq_len, args.seed, args.gen_batch)
    val_spec = DataSpec("val", args.num_val_sequences, args.val_seq_len, args.seed + 1, args.gen_batch)
    train_data = distillation_data(target, args.target, split.train, train_spec, args.data_dir, layers, True)
    val = distillation_data(target, args.target, split.val, val_spec, args.data_dir, layers, True)
    data_seconds = time.monotonic() - began_all

    settings = [
        *("num_layers", "block_size", "target_layer_ids", "markov_rank", "confidence_head", "ce_weight"),
        *("l1_weight", "bce_weight", "num_sequences", "seq_len", "steps", "batch_size", "anchors", "lr"),
        *("warmup", "weight_decay", "loss_decay", "seed", "mask_token_id"),
    ]
    fingerprint = {key: getattr(args, key) for key in settings} | {
        "markov_head_type": args.markov_head_type.value,
        "acceptance": args.acceptance.value,
        "autocast": not args.no_autocast,
        "target": target_digest(args.target),
        "init_from": None if args.init_from is None else str(args.init_from),
    }
    optimizer = adamw(model, args.lr, args.weight_decay)
    proposer = deepspec_proposer(model, target, val, args)

    def validate(done: int, loss: float) -> dict[str, float]:
        model.eval()
        return {
            "loss": loss,
            "val_mean_accepted": measure(val, k, proposer, EVAL_SAMPLES).total.mean_accepted,
        }

    losses = deepspec_loss(model, target, train_data, args)
    history, train_seconds = train(model, optimizer, args, fingerprint, losses, validate, "dspark")

    model.eval()
    rows: dict[str, Measured] = {f"{args.title} K={k}": measure(val, k, proposer)}
    for folder in args.compare:
        rows[f"`{folder.name}` K={k}"] = measure(val, k, folder_proposer(folder, target, val, k))
    rows[f"n-gram K={k} (n in [1, 4])"] = ngram_measured(val, k)
    for name, measured in rows.items():
        print(f"held-out acceptance, {name}: {measured.total.describe()}")
    val_terms = held_out_terms(model, target, val, args)

    if args.out_dir.exists():
        shutil.rmtree(args.out_dir)
    write_dspark_checkpoint(args.out_dir, config, dict(model.named_parameters()), args.target)

    def block_logits(i: int, blocks: Blocks) -> Tensor:
        return slot_outputs(model, target, val.features[i : i + 1], blocks, k, teacher_forced=False).logits

    compared = check_against_engine(args.out_dir, args.target, model, val, args, k, block_logits)
    print(f"the engine's drafter proposes what the training forward does on {compared} held-out blocks")
    write_card(args, split, data_seconds, train_seconds, val_terms, rows, history, compared)
    print(f"wrote {args.out_dir} in {format_minutes(time.monotonic() - began_all)}")


if __name__ == "__main__":
    main()
