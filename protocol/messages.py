"""Wire messages between the frontend and the engine-core processes.

Two directions, each one tagged union:

- frontend ``ROUTER`` -> engine ``DEALER``: :data:`EngineInput` (requests, aborts, hello requests);
- engine ``PUSH`` -> frontend ``PULL``: :data:`EngineOutput` (the hello, then outputs and heartbeats).

Every struct is a msgspec ``Struct`` encoded as MessagePack arrays (``array_like``): positional and compact,
so field order is part of the protocol. Add fields only at the end, with defaults, and bump
``PROTOCOL_VERSION`` for anything else.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from openinfer.protocol.counters import MAX_SPEC_TOKENS, PrefixCacheCounters, SpecDecodeCounters
from openinfer.protocol.kv_events import KVEventsEndpoint

__all__ = ["MAX_SPEC_TOKENS", "PrefixCacheCounters", "SpecDecodeCounters"]  # re-exported: messages carry them

# Bumped on any incompatible change to a message below; the hello carries it.
PROTOCOL_VERSION = 5


StructuredKind = Literal["json", "json_object", "regex", "choice", "grammar"]


class StructuredOutputs(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """A grammar the request's output must follow (vLLM's structured outputs, compiled by xgrammar)."""

    kind: StructuredKind
    # json: a JSON schema's text; json_object: ""; regex: a regular expression; choice: a JSON list of the
    # strings allowed; grammar: an EBNF grammar (xgrammar's dialect, rule ``root``)
    spec: str
    # json kinds: any whitespace between tokens (vLLM: not disable_any_whitespace); else compact
    any_whitespace: bool = True
    # None: the grammar applies from the first output token; a token id (a reasoning parser's ``</think>``):
    # output is free until that token and follows the grammar after it
    start_after_token_id: int | None = None


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """How one request samples and when it stops (the engine never sees strings)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None  # None: whole vocabulary
    seed: int | None = None  # None: the engine's global generator
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k >= 0: each output token's logprob and the top k alternatives
    # vLLM's logits processors, applied in its order: bad words and min_tokens mask, logit_bias adds, then the
    # penalties; min_p comes after temperature. Output tokens are this request's, draft positions included.
    presence_penalty: float = 0.0  # in [-2, 2]: subtracted once from each token already in the output
    frequency_penalty: float = 0.0  # in [-2, 2]: subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # > 0: a token in the prompt or output has its logit divided (>0) or
    # multiplied (<0) by it
    min_tokens: int = 0  # in [0, max_tokens]: stop_token_ids and EOS (unless ignore_eos) masked until then
    logit_bias: dict[int, float] = {}  # token id -> added to its raw logit, in [-100, 100]
    # token-id sequences (the frontend tokenizes the words): a sequence's last token is masked where the
    # output ends with the tokens before it (a one-token sequence: always)
    bad_words_token_ids: list[list[int]] = []
    min_p: float = 0.0  # in [0, 1]: after temperature, tokens below min_p x the top probability are dropped
    structured_outputs: StructuredOutputs | None = None  # None: unconstrained


class EngineCoreRequest(msgspec.Struct, tag="req", array_like=True, omit_defaults=True, gc=False):
    """A new request for one engine: prompt token ids and sampling params."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0


class AbortRequests(msgspec.Struct, tag="abort", array_like=True):
    """Stop these requests now and free their KV blocks; unknown ids are ignored."""

    request_ids: list[str]


class HelloRequest(msgspec.Struct, tag="hello_req", array_like=True):
    """Ask an engine to send its hello again (a frontend that started after it)."""


class LoadDrafter(msgspec.Struct, tag="load_drafter", array_like=True):
    """Load (or replace) the engine's drafter; the engine answers with a :class:`DrafterReply`."""

    command_id: str
    method: DrafterMethod
    num_spec_tokens: int
    draft_model: str | None = None  # the DFlash checkpoint folder, as the engine's host sees it
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    dflash_anchor: DFlashAnchor | None = None  # None: read from the checkpoint's config
    confidence_threshold: float = 0.0  # dspark: verify drafts up to the first below it; 0: all of them
    enable_adaptive_verification: bool = False  # verify the drafts that pay, for the whole step


class UnloadDrafter(msgspec.Struct, tag="unload_drafter", array_like=True):
    """Turn speculative decoding off on this engine; answered with a :class:`DrafterReply`."""

    command_id: str


class HelloRefused(msgspec.Struct, tag="hello_refused", array_like=True):
    """The frontend will not take this engine (another protocol version, a tokenizer it cannot load, an index
    a live engine holds, no room for another index), or no longer (two processes sent as its incarnation);
    the engine logs why and stops.

    Its shape (tag, version, message) stays the same in every protocol version, so any engine can read it.
    """

    protocol_version: int  # the frontend's
    message: str


EngineInput = EngineCoreRequest | AbortRequests | HelloRequest | LoadDrafter | UnloadDrafter | HelloRefused


class LoadSnapshot(msgspec.Struct, array_like=True, gc=False):
    """An engine's load at the moment it sent a message."""

    kv_used_blocks: int
    kv_total_blocks: int
    num_running_reqs: int
    num_waiting_reqs: int
    spec_decode: SpecDecodeCounters | None = None
    prefix_cache: PrefixCacheCounters | None = None  # None: prefix caching is off


DrafterMethod = Literal["ngram", "dflash", "dspark"]  # the drafters an engine can load (docs/design.md)
DFlashAnchor = Literal["mask_slots", "anchor_slot"]  # where a DFlash block's position 0 is
FinishKind = Literal["stop", "length", "abort", "error"]


class FinishReason(msgspec.Struct, array_like=True, frozen=True):
    """Why a request ended: "stop" (EOS or a stop token), "length", "abort" or "error", with a message."""

    kind: FinishKind
    stop_token_id: int | None = None
    message: str | None = None
    # "error" only: the engine refused the request for what it asked (a grammar that does not compile, a
    # prompt past the model length), a client's error (HTTP 400) rather than the engine's (500)
    bad_request: bool = False


class TokenLogprobs(msgspec.Struct, array_like=True, gc=False):
    """One output token's log-probabilities under the target's raw distribution: log_softmax of its logits
    before temperature, top-k and top-p (vLLM's default), for requests that set ``SamplingParams.logprobs``.
    """

    logprob: float  # of the sampled token (-inf where the logit is -inf)
    top_token_ids: list[int] = []  # the k most likely tokens, most likely first (k = SamplingParams.logprobs)
    top_logprobs: list[float] = []  # their logprobs, in the same order


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """New tokens of one request since the last message; ``finish`` is set on its last output."""

    request_id: str
    new_token_ids: list[int]
    finish: FinishReason | None = None
    num_cached_tokens: int = 0  # on a request's first output: prompt tokens its prefix-cache hit held
    # on the last output, when a drafter was loaded: this request's own counters (summed over requests they
    # equal the engine counters' deltas)
    spec_stats: SpecDecodeCounters | None = None
    logprobs: list[TokenLogprobs] | None = None  # one per new token, when the request asked for logprobs


class EngineCoreOutputs(msgspec.Struct, tag="out", array_like=True, gc=False):
    """One engine step's outputs, or a heartbeat when ``outputs`` is empty (at least once a second)."""

    engine_index: int
    incarnation: int
    seq: int  # 0, 1, 2, ... per incarnation; the hello is seq 0
    timestamp: float
    outputs: list[EngineCoreOutput]
    load: LoadSnapshot


class EngineHello(msgspec.Struct, tag="hello", array_like=True):
    """An engine's first message of an incarnation, and its answer to a :class:`HelloRequest`.

    It carries the tokenizer files so that a frontend on another host needs no copy of the model.
    """

    protocol_version: int
    engine_index: int
    incarnation: int  # random 64-bit id chosen at process start
    seq: int
    model_name: str
    max_model_len: int
    kv_block_size: int
    kv_num_blocks: int
    num_spec_tokens: int | None
    vocab_size: int
    eos_token_ids: list[int]
    tokenizer_json: bytes  # the model folder's tokenizer.json
    tokenizer_config_json: bytes  # its tokenizer_config.json (chat template, special tokens), or b"{}"
    load: LoadSnapshot
    # True toward the engine's metrics frontend (its first --frontend), which alone exports the engine's
    # counters and gauges; False toward the others (several frontends over the same engines)
    exports_metrics: bool = True
    kv_events: KVEventsEndpoint | None = None  # where it publishes KV events (--kv-events-config); None: not


class DrafterReply(msgspec.Struct, tag="drafter_reply", array_like=True):
    """The engine's answer to :class:`LoadDrafter` / :class:`UnloadDrafter`, with its load right after."""

    engine_index: int
    incarnation: int
    seq: int
    command_id: str
    ok: bool
    message: str  # what was done, or why not
    num_spec_tokens: int | None  # the drafter now in effect
    load: LoadSnapshot


EngineOutput = EngineHello | EngineCoreOutputs | DrafterReply


def engine_identity(engine_index: int, incarnation: int) -> bytes:
    """The ZMQ routing id an engine's DEALER uses: unique per index and incarnation."""
    return b"engine-%d-%016x" % (engine_index, incarnation)
