"""Structured outputs through xgrammar: grammars compiled off the step loop, token bitmasks per step.

A request's constraint (a JSON schema, any JSON object, a regex, a choice of strings, or an EBNF grammar) is
compiled once per distinct constraint, in a background thread, into an xgrammar ``CompiledGrammar`` (xgrammar
caches them); the request waits for it outside the scheduler, so it holds up no other request. While it runs,
its :class:`RequestGrammar` fills the bitmask of the tokens the grammar allows at each of its logits rows: after
its last token and, when it verifies drafts, after each of them in turn. The first draft the grammar refuses
ends the run (its row refuses it, so verification rejects it there, and the rows past it are never read); the
drafts accepted into the matcher to fill the rows are rolled back, and once verification says which tokens the
request keeps, ``advance`` accepts them for good.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import torch
import xgrammar as xgr
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from openinfer.engine_core.request import Request
from openinfer.engine_core.request_grammar import RequestGrammar
from openinfer.engine_core.scheduler_output import ScheduledRequest
from openinfer.protocol import StructuredOutputs

logger = logging.getLogger(__name__)

_CACHE_LIMIT_BYTES = 512 << 20  # compiled grammars xgrammar keeps for the next request with the same one
COMPILE_THREADS = 2
COMPILE_TIMEOUT_S = 30.0  # a request waits at most this long for its grammar (vLLM: 5 s for a regex)


def tokenizer_info(tokenizer_json: Path, vocab_size: int, stop_token_ids: Sequence[int]) -> xgr.TokenizerInfo:
    """The vocabulary as xgrammar reads it: the model's vocab_size (rows past the tokenizer's are never
    allowed), special tokens never spelled as text, the stop tokens ending every grammar."""
    raw = Tokenizer.from_file(str(tokenizer_json))
    found = xgr.TokenizerInfo.from_huggingface(  # its vocabulary type and prefix-space rule
        PreTrainedTokenizerFast(tokenizer_object=raw),
        vocab_size=vocab_size,
        stop_token_ids=list(stop_token_ids),
    )
    # xgrammar reads an empty token as special.
    special = {i for i, token in raw.get_added_tokens_decoder().items() if token.special}
    vocab = ["" if i in special else raw.id_to_token(i) or "" for i in range(raw.get_vocab_size())]
    return xgr.TokenizerInfo(
        vocab,
        found.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=list(stop_token_ids),
        add_prefix_space=found.add_prefix_space,
    )


class GrammarCompilers:
    """One xgrammar compiler for the engine's tokenizer (built in the background on first use) and the
    compilations in flight."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        self._tokenizer = (tokenizer_json, vocab_size, tuple(sorted(stop_token_ids)))
        self._compiler: xgr.GrammarCompiler | None = None  # built under the lock, by the pool's threads
        self._lock = threading.Lock()
        # Two threads: a constraint xgrammar takes long over leaves one for the others.
        self._pool = ThreadPoolExecutor(max_workers=COMPILE_THREADS, thread_name_prefix="grammar")
        self._in_flight: dict[StructuredOutputs, Future[xgr.CompiledGrammar]] = {}

    def compile(self, constraint: StructuredOutputs) -> Future[xgr.CompiledGrammar]:
        """The compilation of one constraint, started now unless it is under way; its result raises
        ``ValueError`` (with xgrammar's message) for a constraint that does not compile."""
        key = StructuredOutputs(constraint.kind, constraint.spec, constraint.any_whitespace)  # the grammar
        self._in_flight = {k: f for k, f in self._in_flight.items() if not f.done()}
        future = self._in_flight.get(key)
        if future is None:
            future = self._in_flight[key] = self._pool.submit(self._compile, key)
        return future

    def warm(self) -> None:
        """Build the compiler for the vocabulary now, in the background (seconds for Qwen3's), so that the
        first constrained request waits only for its own grammar."""
        self._pool.submit(self._compiler_now)

    def _compiler_now(self) -> xgr.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                info = tokenizer_info(*self._tokenizer)
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=1, cache_limit_bytes=_CACHE_LIMIT_BYTES
                )
            return self._compiler

    def _compile(self, constraint: StructuredOutputs) -> xgr.CompiledGrammar:
        compiler = self._compiler_now()
        kind, spec, any_whitespace = constraint.kind, constraint.spec, constraint.any_whitespace
        try:
            if kind in ("json", "json_object"):
                schema = spec if kind == "json" else '{"type": "object"}'
                # Without any whitespace, JSON is compact (vLLM's separators): {"a":1,"b":[2,3]}
                separators = None if any_whitespace else (",", ":")
                return compiler.compile_json_schema(
                    schema, any_whitespace=any_whitespace, separators=separators
                )
            if kind == "regex":
                return compiler.compile_regex(spec)
            if kind == "choice":
                choices = json.loads(spec)
                if not choices or not all(isinstance(choice, str) for choice in choices):
                    raise ValueError("a choice is a non-empty list of strings")
                return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in choices))
            return compiler.compile_grammar(spec)
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"the {kind} constraint does not compile: {e}") from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class GrammarQueue:
    """Requests whose grammar is compiling, in arrival order; they join the scheduler's queue when it is
    ready."""

    def __init__(self, compilers: GrammarCompilers, timeout_s: float = COMPILE_TIMEOUT_S) -> None:
        self.compilers = compilers
        self.timeout_s = timeout_s
        self._waiting: list[tuple[Request, Future[xgr.CompiledGrammar], float]] = []  # ..., its deadline

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, request: Request, constraint: StructuredOutputs) -> None:
        deadline = time.monotonic() + self.timeout_s
        self._waiting.append((request, self.compilers.compile(constraint), deadline))

    def take_ready(self) -> list[tuple[Request, str | None]]:
        """The requests whose compilation ended, each with None (its ``grammar`` is set) or why it failed;
        a request still waiting past its deadline fails (a constraint xgrammar takes too long over must not
        hang its request)."""
        ready: list[tuple[Request, str | None]] = []
        still: list[tuple[Request, Future[xgr.CompiledGrammar], float]] = []
        now = time.monotonic()
        for request, future, deadline in self._waiting:
            if not future.done():
                if now < deadline:
                    still.append((request, future, deadline))
                else:
                    ready.append((request, f"the constraint did not compile within {self.timeout_s:g} s"))
                continue
            error = future.exception()
            if error is None:
                constraint = request.sampling_params.structured_outputs
                start_after = constraint.start_after_token_id if constraint is not None else None
                request.grammar = RequestGrammar(future.result(), start_after)
            ready.append((request, None if error is None else str(error)))
        self._waiting = still
        return ready

    def remove(self, request: Request) -> bool:
        """Forget a request (aborted while it waited); False when it was not waiting here."""
        kept = [entry for entry in self._waiting if entry[0] is not request]
        removed = len(kept) < len(self._waiting)
        self._waiting = kept
        return removed

    def wait(self, timeout_s: float) -> None:
        """Block until a compilation ends or ``timeout_s`` passes (an engine with nothing else to do)."""
        wait([future for _, future, _ in self._waiting], timeout_s, return_when=FIRST_COMPLETED)


def allocate_masks(num_rows: int, vocab_size: int) -> torch.Tensor:
    """(num_rows, ceil(vocab / 32)) int32 bitmasks, every token allowed."""
    return xgr.allocate_token_bitmask(num_rows, vocab_size)


@torch.inference_mode()  # the runner's logits are inference tensors: updated in place under it
def apply_masks(logits: torch.Tensor, masks: torch.Tensor, rows: list[int] | None = None) -> None:
    """Set the logits the masks refuse to -inf, in place (``rows``: only those rows; masks has as many rows
    as logits)."""
    xgr.apply_token_bitmask_inplace(logits, masks.to(logits.device, non_blocking=True), indices=rows)


def apply_grammars(logits: torch.Tensor, sampling: Sequence[ScheduledRequest], starts: Sequence[int]) -> None:
    """Mask one step's logits rows (``len(drafts) + 1`` per sampling request from ``starts[i]`` on) by the
    requests' grammars, in place; a step with no constrained request costs one pass over its requests."""
    if all(s.request.grammar is None for s in sampling):
        return
    masks = allocate_masks(logits.shape[0], logits.shape[1])
    rows: list[int] = []
    for s, row in zip(sampling, starts, strict=True):
        if s.request.grammar is not None:
            rows += s.request.grammar.fill(masks, row, s.spec_token_ids)
    if rows:
        apply_masks(logits, masks, rows)
