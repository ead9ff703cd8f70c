"""Distil the built-in DFlash drafter from the built-in target. Run once by the project (after
tools/train_target.py); the output folder is committed as package data.

    python tools/train_dflash.py [TEXT] [--target engine_core/builtin/target]
        [--out-dir engine_core/builtin/dflash] [--work-dir runs/train_dflash] [--steps 1200] [--seed 0]

TEXT is the training text: by default the tinyshakespeare that ships in `engine_core/builtin/data/`.

1. Data: prompts cut from the training part of the text (the last tenth stays held out, as for the target),
   continued greedily by the target (batched, over a KV cache): the drafter learns the target's OWN greedy text,
   which is what it must predict when serving at temperature 0. Prompt lengths vary (PROMPT_LENS); every
   sequence is --seq-len tokens. The target's outputs of decoder layers --target-layer-ids at every position
   are the context features, computed once in float32.
2. Model: `DFlashDraftModel` from the engine (the same modules, so the same parameter names), run by
   `draft_hidden` (tools/dflash_forward.py) in a training form: many draft blocks of one sequence in one
   pass. Each block is the current token at an anchor position p (a generated token) then mask tokens at
   p+1..p+block_size-1; it sees the context keys/values of positions < p (fc -> hidden_norm -> each layer's
   k/v) and its own block, non-causally, exactly as `DFlashDrafter.propose` does. The target's embedding
   and LM head are shared and frozen.
3. Loss: cross-entropy of the draft slots against the target's greedy tokens at p+1..p+K, slot k weighted by
   exp(-(k-1)/--loss-decay) (an early slot's miss ends the round, so early slots count more).
4. Checks: the simulated greedy acceptance on held-out prompts (rounds walk the continuation as the engine
   does, K = block_size - 1 drafts each) for the drafter and for n-gram lookup (vLLM's, n in [1, 4]); then
   the written folder is loaded with the engine's `DFlashDrafter` next to the engine's target and its
   proposals must equal this script's forward on held-out samples.

The parts live beside it: tools/dflash_data.py (1), tools/dflash_forward.py (2, 3), tools/dflash_card.py (4
and the model card); tools/training.py holds the training loop both training scripts run.

Seeded; step s trains on the batch drawn by a generator seeded with (seed, s), and a checkpoint written to
--work-dir every --checkpoint-every steps is picked up automatically, so a resumed run ends where an
uninterrupted one does. Writes config.json and model.safetensors in z-lab's layout (through
`write_dflash_checkpoint`, as `make_tiny_dflash_checkpoint` does) and README.md, the model card.
"""

from __future__ import annotations

import argparse
import shutil
import time

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash_config import AnchorLayout
from openinfer.engine_core.testing.dflash_checkpoint import dflash_checkpoint_config, write_dflash_checkpoint
from openinfer.tools.dflash_card import check_against_engine, measure, write_card, zlab_block_logits
from openinfer.tools.dflash_data import (
    SEQ_LEN,
    DataSpec,
    distillation_data,
    load_target,
    mask_token,
    target_digest,
)
from openinfer.tools.dflash_forward import (
    distillation_loss,
    new_drafter,
    slot_losses,
    slot_weight_vector,
)
from openinfer.tools.training import (
    adamw,
    add_training_flags,
    drafter_arg_parser,
    format_minutes,
    start_run,
    train,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = drafter_arg_parser(__doc__, "dflash", "train_dflash", "data and checkpoint")
    parser.add_argument("--num-layers", type=int, default=3, help="draft decoder layers")
    parser.add_argument("--block-size", type=int, default=8, help="draft block: current token + masks")
    parser.add_argument(
        "--anchor",
        choices=[a.value for a in AnchorLayout],
        default="anchor_slot",
        help="which block slots draft: anchor_slot (slot i drafts p+i+1) beat z-lab's mask_slots here",
    )
    parser.add_argument("--target-layer-ids", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-sequences", type=int, default=4096, help="greedy sequences to train on")
    parser.add_argument("--num-val-sequences", type=int, default=64, help="held-out sequences to measure on")
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN, help="prompt + greedy continuation, tokens")
    parser.add_argument("--gen-batch", type=int, default=256, help="sequences generated at once")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--anchors", type=int, default=32, help="draft blocks per sequence per step")
    parser.add_argument("--loss-decay", type=float, default=4.0, help="slot k's weight is exp(-(k-1)/this)")
    add_training_flags(parser, lr=2e-3, warmup=50, weight_decay=0.01, eval_every=250, checkpoint_every=100)
    args = parser.parse_args(argv)
    args.anchor = AnchorLayout(args.anchor)
    return args


def main() -> None:
    args = parse_args()
    began_all = time.monotonic()
    k = args.block_size - 1  # drafts per round: a block's first slot holds the current token
    split = start_run(args)
    args.mask_token_id = mask_token(split)
    target = load_target(args.target)
    target_config = ModelConfig.from_folder(args.target)
    config = dflash_checkpoint_config(
        target_config,
        num_layers=args.num_layers,
        block_size=args.block_size,
        target_layer_ids=tuple(args.target_layer_ids),
        mask_token_id=args.mask_token_id,
        anchor=args.anchor,
    )
    model = new_drafter(config, args.seed)

    layer_ids = args.target_layer_ids
    train_spec = DataSpec("train", args.num_sequences, args.seq_len, args.seed, args.gen_batch)
    val_spec = DataSpec("val", args.num_val_sequences, args.seq_len, args.seed + 1, args.gen_batch)
    train_data = distillation_data(target, args.target, split.train, train_spec, args.work_dir, layer_ids)
    val = distillation_data(target, args.target, split.val, val_spec, args.work_dir, layer_ids)
    data_seconds = time.monotonic() - began_all

    fingerprint = {
        key: getattr(args, key)
        for key in (
            "num_layers",
            "block_size",
            "target_layer_ids",
            "num_sequences",
            "seq_len",
            "steps",
            "batch_size",
            "anchors",
            "lr",
            "warmup",
            "weight_decay",
            "loss_decay",
            "seed",
            "mask_token_id",
        )
    } | {"anchor": args.anchor.value, "autocast": not args.no_autocast, "target": target_digest(args.target)}
    optimizer = adamw(model, args.lr, args.weight_decay)

    def validate(done: int, loss: float) -> dict[str, float]:
        return {"loss": loss, "val_mean_accepted": measure(model, target, val, args)[0].mean_accepted}

    losses = distillation_loss(model, target, train_data, args)
    history, train_seconds = train(model, optimizer, args, fingerprint, losses, validate, "dflash")

    dflash, ngram = measure(model, target, val, args)
    slot_weights = slot_weight_vector(k, args.loss_decay)
    train_loss = slot_losses(model, target, train_data, args, slot_weights)
    val_loss = slot_losses(model, target, val, args, slot_weights)
    print(f"held-out acceptance, DFlash K={k}: {dflash.describe()}")
    print(f"held-out acceptance, n-gram K={k}: {ngram.describe()}")
    print(f"final weighted loss (nats/slot): train {train_loss:.4f}, held out {val_loss:.4f}")

    if args.out_dir.exists():
        shutil.rmtree(args.out_dir)
    write_dflash_checkpoint(args.out_dir, config, dict(model.named_parameters()))
    forward = zlab_block_logits(model, target, val, args)
    compared = check_against_engine(args.out_dir, args.target, model, val, args, k, forward)
    print(f"the engine's DFlashDrafter proposes what the training forward does on {compared} held-out blocks")
    write_card(
        args, split, data_seconds, train_seconds, train_loss, val_loss, dflash, ngram, history, compared
    )
    print(f"wrote {args.out_dir} in {format_minutes(time.monotonic() - began_all)}")


if __name__ == "__main__":
    main()
