"""Structured outputs through xgrammar: grammars compiled off the step loop, token bitmasks per step.

A request's constraint (a JSON schema, any JSON object, a regex, a choice of strings, or an EBNF grammar) is
compiled once per distinct constraint, in a background thread, into an xgrammar ``CompiledGrammar`` (cached);
the request waits for it without holding up the others. While it runs, its :class:`RequestGrammar` gives the
bitmask of the tokens the grammar allows at each logits row of a step: after its last token, and, when it
verifies drafts, after each of them in turn (the first draft the grammar refuses ends the run; rows past it
repeat that row's mask, since verification stops there). The masks are computed on a fork-free walk: drafts
are accepted into the matcher, the rows' masks filled, and the drafts rolled back; once verification says which
tokens the request keeps, ``advance`` accepts them for good.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import torch
import xgrammar as xgr
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

ConstraintKind = Literal["json", "json_object", "regex", "choice", "grammar"]


class GrammarCompilers:
    """One xgrammar compiler for the engine's tokenizer and the compilations it has done or is doing."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        raw = Tokenizer.from_file(str(tokenizer_json))
        found = xgr.TokenizerInfo.from_huggingface(  # its vocabulary type and prefix-space rule
            PreTrainedTokenizerFast(tokenizer_object=raw),
            vocab_size=vocab_size,
            stop_token_ids=list(stop_token_ids),
        )
        # Special tokens are never text a grammar may spell out (xgrammar reads an empty token as special);
        # the stop tokens end it.
        special = {i for i, token in raw.get_added_tokens_decoder().items() if token.special}
        vocab = ["" if i in special else raw.id_to_token(i) or "" for i in range(raw.get_vocab_size())]
        self.info = xgr.TokenizerInfo(
            vocab,
            found.vocab_type,
            vocab_size=vocab_size,
            stop_token_ids=list(stop_token_ids),
            add_prefix_space=found.add_prefix_space,
        )
        self._compiler = xgr.GrammarCompiler(self.info)  # caches compiled grammars itself
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._compiling: dict[tuple[str, str], Future[xgr.CompiledGrammar]] = {}

    def compile(self, kind: ConstraintKind, spec: str) -> Future[xgr.CompiledGrammar]:
        """The compilation of one constraint, started now unless it already was; its result raises
        ``ValueError`` (with xgrammar's message) for a constraint that does not compile."""
        key = (kind, spec)
        future = self._compiling.get(key)
        if future is None or (future.done() and future.exception() is not None):
            future = self._compiling[key] = self._pool.submit(self._compile, kind, spec)
        return future

    def _compile(self, kind: ConstraintKind, spec: str) -> xgr.CompiledGrammar:
        try:
            if kind == "json":
                return self._compiler.compile_json_schema(spec)
            if kind == "json_object":
                return self._compiler.compile_builtin_json_grammar()
            if kind == "regex":
                return self._compiler.compile_regex(spec)
            if kind == "choice":
                choices = json.loads(spec)
                return self._compiler.compile_grammar(
                    "root ::= " + " | ".join(json.dumps(choice) for choice in choices)
                )
            return self._compiler.compile_grammar(spec)
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"the {kind} constraint does not compile: {e}") from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class RequestGrammar:
    """One request's place in its grammar, and the masks of the rows it samples from."""

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self._vocab_size = vocab_size

    def masks(self, drafts: Sequence[int]) -> torch.Tensor:
        """(1 + len(drafts), ceil(vocab / 32)) int32 bitmasks: row i allows what may follow the request's
        tokens and drafts[:i]. The matcher ends where it began."""
        rows = xgr.allocate_token_bitmask(1 + len(drafts), self._vocab_size)
        accepted = 0
        for i in range(len(drafts) + 1):
            self._matcher.fill_next_token_bitmask(rows, i)
            if i == len(drafts) or not self._matcher.accept_token(drafts[i]):
                rows[i + 1 :] = rows[i]  # verification stops at row i: what follows is never read
                break
            accepted += 1
        if accepted:
            self._matcher.rollback(accepted)
        return rows

    def advance(self, tokens: Sequence[int]) -> None:
        """Accept the tokens the step kept (accepted drafts, then the sampled token)."""
        for token in tokens:
            if not self._matcher.accept_token(token):
                raise ValueError(f"token {token} breaks the grammar its mask allowed")

    @property
    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()


def apply_masks(logits: torch.Tensor, masks: torch.Tensor) -> None:
    """Set the logits of tokens the masks refuse to -inf, in place (rows of logits and masks correspond)."""
    xgr.apply_token_bitmask_inplace(logits, masks.to(logits.device, non_blocking=True))
