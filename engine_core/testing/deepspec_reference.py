"""DeepSeek's DeepSpec batch-1 loop for a DSpark checkpoint, written independently of openinfer's engine: the
oracle of its DSpark rounds at temperature 0 (docs/design.md).

The algorithm is DeepSpec's evaluator (``eval/base_evaluator.py`` and ``eval/dspark``, read, not copied): the
target (transformers' ``Qwen3ForCausalLM``) prefills the prompt and samples the first token; each round the
draft block is the current token (the anchor) and ``block_size - 1`` mask tokens over the target's hidden
states at every verified position; slot k's logits are the checkpoint's ``lm_head`` of its hidden state plus
the Markov bias of the token before it, drafted greedily slot by slot; the confidence head rates each slot from
its hidden state and the Markov embedding of the token before it; the target verifies the anchor and the
drafts before the first one rated below the threshold, accepts the longest prefix that equals its argmax and
adds its own next token; the context grows by the target's hidden states at the anchor and the accepted drafts.

The parts come from code someone else wrote: the draft backbone is z-lab's ``DFlashDraftModel`` forward (PyPI
``dflash``; DeepSpec's backbone is the same fc + hidden_norm + non-causal layers over the context), the heads
are PyPI ``speculators``' ``MarkovHead`` and ``ConfidenceHead`` (from their file: they need only torch), each
loaded from the checkpoint's own tensors.

One departure, openinfer's counter semantics: a round proposes at most the drafts the request has room for
(max_tokens), where DeepSpec drafts the whole block and trims the output at the end; with no room left, the
token is decoded without a round. transformers 5.2x's ``DynamicCache.crop`` takes the count to remove
(negative), where DeepSpec's pinned 5.10 took the length to keep.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor


@dataclass(frozen=True)
class Round:
    """One round: drafts proposed, verified (the prefix the threshold keeps; 0: none) and accepted, and the
    proposed drafts' confidences (1.0 each without a confidence head)."""

    proposed: int
    verified: int
    accepted: int
    confidence: list[float]


@dataclass(frozen=True)
class ReferenceRun:
    tokens: list[int]  # the output tokens
    rounds: list[Round]


def speculators_dspark_heads() -> ModuleType | None:
    """speculators' ``models/dspark/model_definitions.py`` (MarkovHead, ConfidenceHead), loaded from its
    file (the package's own ``__init__`` pulls in its training stack); None when it is not installed."""
    return _speculators_file("models/dspark/model_definitions.py", "speculators_dspark_heads")


def speculators_eager_losses() -> ModuleType | None:
    """speculators' ``losses/eager.py`` (its reference ce_loss, tv_loss, ...: torch alone), loaded from its
    file; None when it is not installed."""
    return _speculators_file("losses/eager.py", "speculators_eager_losses")


def _speculators_file(relative: str, name: str) -> ModuleType | None:
    spec = importlib.util.find_spec("speculators")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / relative
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        return None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


class DeepSpecReference:
    """A DSpark checkpoint beside its target, float32 on the CPU, run one prompt at a time."""

    def __init__(self, target_folder: Path, draft_folder: Path, heads: ModuleType) -> None:
        import dflash.model as zlab
        from transformers import Qwen3Config, Qwen3ForCausalLM

        self.target = Qwen3ForCausalLM.from_pretrained(target_folder, dtype=torch.float32).eval()
        config = Qwen3Config.from_pretrained(draft_folder)
        config.architectures = ["DFlashDraftModel"]
        self.draft = zlab.DFlashDraftModel(config).eval()
        weights = load_file(draft_folder / "model.safetensors")
        backbone = {
            name: t
            for name, t in weights.items()
            if name.split(".")[0] in ("layers", "fc", "hidden_norm", "norm")
        }
        self.draft.load_state_dict(backbone, strict=False)
        missing = {n for n, _ in self.draft.named_parameters()} - set(backbone)
        if missing:
            raise ValueError(f"the DSpark checkpoint lacks backbone tensors {sorted(missing)}")
        self.config: Any = config
        self.layer_ids: list[int] = list(config.target_layer_ids)
        self.block_size: int = int(config.block_size)
        self.mask_token_id: int = int(config.mask_token_id)
        self.embed, self.lm_head = weights["embed_tokens.weight"], weights["lm_head.weight"]
        rank = int(getattr(config, "markov_rank", 0) or 0)
        self.markov: Any = None
        if rank > 0:
            self.markov = heads.MarkovHead(
                verifier_vocab_size=config.vocab_size,
                draft_vocab_size=config.vocab_size,
                markov_rank=rank,
                hidden_size=config.hidden_size,
                head_type=getattr(config, "markov_head_type", "vanilla"),
            )
            self.markov.load_state_dict(_prefixed(weights, "markov_head."))
        self.confidence: Any = None
        self.with_markov = bool(getattr(config, "confidence_head_with_markov", False))
        if getattr(config, "enable_confidence_head", False):
            self.confidence = heads.ConfidenceHead(config.hidden_size + (rank if self.with_markov else 0))
            self.confidence.load_state_dict(_prefixed(weights, "confidence_head."))

    @torch.no_grad()
    def run(self, prompt: list[int], max_tokens: int, k: int, threshold: float) -> ReferenceRun:
        """Greedy generation of ``max_tokens`` tokens (no stop tokens) proposing up to ``k`` drafts a round."""
        from transformers import DynamicCache

        target_cache, draft_cache = DynamicCache(), DynamicCache()
        out = self._target(torch.tensor([prompt]), 0, target_cache)
        tokens = [*prompt, int(out.logits[0, -1].argmax())]
        context = self._features(out)  # (1, positions, width): the context the drafter has not seen yet
        limit = len(prompt) + max_tokens
        rounds: list[Round] = []
        rated: list[float] = []
        while len(tokens) < limit:
            start, anchor = len(tokens) - 1, tokens[-1]
            room = min(k, limit - len(tokens) - 1)
            drafts: list[int] = []
            verified = 0
            if room > 0:
                drafts, rated = self._propose(anchor, start, context, draft_cache)
                drafts, rated = drafts[:room], rated[:room]
                verified = next((i for i, c in enumerate(rated) if threshold and c < threshold), len(drafts))
            out = self._target(torch.tensor([[anchor, *drafts[:verified]]]), start, target_cache)
            posterior = out.logits[0].argmax(dim=-1).tolist()
            accepted = 0
            while accepted < verified and drafts[accepted] == posterior[accepted]:
                accepted += 1
            if room > 0:
                rounds.append(Round(len(drafts), verified, accepted, rated))
            tokens += [*drafts[:accepted], posterior[accepted]]
            _crop(target_cache, start + accepted + 1)
            context = self._features(out)[:, : accepted + 1]
        return ReferenceRun(tokens[len(prompt) : limit], rounds)

    def _target(self, ids: Tensor, start: int, cache: Any) -> Any:
        positions = torch.arange(start, start + ids.shape[1])[None]
        return self.target(
            ids, position_ids=positions, past_key_values=cache, use_cache=True, output_hidden_states=True
        )

    def _features(self, out: Any) -> Tensor:
        """The target's outputs of the drafter's layers, concatenated (hidden_states[i + 1] is layer i's)."""
        return torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)

    def _propose(self, anchor: int, start: int, context: Tensor, cache: Any) -> tuple[list[int], list[float]]:
        """The block's greedy drafts and their confidences (1.0 each without a confidence head)."""
        block = torch.tensor([[anchor] + [self.mask_token_id] * (self.block_size - 1)])
        seen = cache.get_seq_length()
        hidden = self.draft(
            position_ids=torch.arange(seen, start + self.block_size)[None],
            noise_embedding=self.embed[block],
            target_hidden=context,
            past_key_values=cache,
            use_cache=True,
        )  # (1, block_size, hidden)
        _crop(cache, start)
        logits = hidden[0] @ self.lm_head.T  # (block_size, vocab)
        previous = [anchor]
        for slot in range(self.block_size):
            if self.markov is not None:
                prev = torch.tensor([previous])  # the anchor, then the drafts so far
                bias = self.markov.block_bias(prev_token_ids=prev, hidden_states=hidden[:, : slot + 1])
                logits[slot] += bias[0, slot]
            previous.append(int(logits[slot].argmax()))
        drafts = previous[1:]
        if self.confidence is None:
            return drafts, [1.0] * len(drafts)
        features = hidden[0]
        if self.with_markov:
            features = torch.cat((features, self.markov.prev_embeddings(torch.tensor(previous[:-1]))), dim=-1)
        return drafts, torch.sigmoid(self.confidence(features)).tolist()


def _prefixed(weights: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {name.removeprefix(prefix): t for name, t in weights.items() if name.startswith(prefix)}


def _crop(cache: Any, length: int) -> None:
    """Keep the cache's first ``length`` positions (transformers 5.2x: crop takes the count to remove)."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)
