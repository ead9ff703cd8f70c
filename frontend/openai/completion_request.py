"""A ``POST /v1/completions`` body, validated into the typed request the API server runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.body.decode import Int64, decode_body, refuse_unsupported
from openinfer.frontend.openai.completion_format import CompletionFormat
from openinfer.frontend.openai.errors import invalid_request
from openinfer.frontend.openai.prepared_request import PreparedRequest
from openinfer.frontend.openai.sampling_options import (
    MAX_LOGPROBS,
    TYPE_MESSAGES,
    UNSUPPORTED,
    SamplingBody,
    SamplingOptions,
    TokenId,
    check_logprobs_count,
)
from openinfer.frontend.openai.structured_options import parse_structured
from openinfer.frontend.openai.structured_outputs_config import StructuredOutputsConfig

# A text prompt up to this long is tokenized on the event loop (well under a millisecond), a longer one in
# a thread (the tokenizer releases the GIL), so that no request stalls the others.
INLINE_PROMPT_CHARS = 4096

_PROMPT_FORMS = (
    "`prompt` must be a string, a list of non-negative integer token ids, or a list of one of those"
)

_UNSUPPORTED = {**UNSUPPORTED, "suffix": ((None, ""), "`suffix` is not supported by openinfer")}

_TYPE_MESSAGES = {
    **TYPE_MESSAGES,
    "prompt": _PROMPT_FORMS,
    # for any wrong type, chat's true / false among them: a completion takes a count
    "logprobs": f"`logprobs` of a completion is the number of alternatives per token, in [0, {MAX_LOGPROBS}]",
}


class CompletionBody(SamplingBody, frozen=True):
    """The JSON body of ``POST /v1/completions``; null means the default, as absent does, unless said."""

    # Text, token ids, or a batch: a list of either (/v1/completions takes a batch of one, its render any).
    prompt: str | list[TokenId | str | list[TokenId]] | None = None
    max_tokens: Int64 | None = 16  # null: as many as the model length leaves
    logprobs: Int64 | None = None
    suffix: Any = None  # refused unless neutral


@dataclass(frozen=True)
class CompletionRequest:
    """What one completion asks for: a prompt, a model and the shared sampling options."""

    prompt: str | list[int]  # text, or token ids
    model: str | None  # None: the first served model
    options: SamplingOptions

    response_prefix: ClassVar[str] = "cmpl"  # of its response id, as vLLM's

    @property
    def prepares_off_loop(self) -> bool:
        """Whether :meth:`prepare` should run in a thread: a long text takes long to tokenize."""
        return isinstance(self.prompt, str) and len(self.prompt) > INLINE_PROMPT_CHARS

    def prepare(self, model: ServedModel, request_id: str) -> PreparedRequest:
        """Tokenize (with the model's special tokens) and bound the request for ``model``."""
        prompt = self.prompt
        self.options.check_before_tokenizing(model, prompt if isinstance(prompt, str) else None, "prompt")
        prompt_token_ids = model.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        return PreparedRequest(
            self.options.engine_request(model, prompt_token_ids, request_id), CompletionFormat
        )


def parse_completion_request(
    body: bytes, structured_config: StructuredOutputsConfig | None = None
) -> CompletionRequest:
    """Decode and validate a request body; raise :class:`ApiError` (400) naming the bad parameter.

    ``structured_config``: the server's structured-outputs settings, put on the request's constraint here
    (default: none)."""
    return parse_completion_batch(body, structured_config, max_prompts=1)[0]


def parse_completion_batch(
    body: bytes, structured_config: StructuredOutputsConfig | None = None, max_prompts: int | None = None
) -> list[CompletionRequest]:
    """As :func:`parse_completion_request`, one request per prompt of the body's batch (a list of texts or of
    token-id lists), at most ``max_prompts`` of them (None: any number, as /v1/completions/render takes)."""
    completion = decode_body(body, CompletionBody, _TYPE_MESSAGES)
    refuse_unsupported(completion, _UNSUPPORTED)
    logprobs = check_logprobs_count(completion.logprobs, "logprobs")
    structured = parse_structured(completion.response_format, completion.structured_outputs)
    structured = (structured_config or StructuredOutputsConfig()).applied(structured)
    options = SamplingOptions.from_body(completion, "max_tokens", completion.max_tokens, logprobs, structured)
    batch = _batch(completion.prompt)
    if max_prompts is not None and len(batch) > max_prompts:
        raise invalid_request(
            f"got {len(batch)} prompts; openinfer takes one prompt per request for now", param="prompt"
        )
    return [CompletionRequest(_prompt(one), completion.model, options) for one in batch]


def _batch(prompt: str | list[int | str | list[int]] | None) -> list[object]:
    """The prompts of a body's ``prompt``: a list of texts or token-id lists is a batch, anything else one."""
    if prompt is None:
        raise invalid_request("`prompt` is required", param="prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return list(prompt)
    return [prompt]


def _prompt(one: object) -> str | list[int]:
    """One prompt of a batch: a string or token ids."""
    if not one:  # "" or []
        raise invalid_request("`prompt` must not be empty", param="prompt")
    if isinstance(one, str):
        return one
    if isinstance(one, list) and all(isinstance(t, int) for t in one):  # not token ids mixed with prompts
        return one
    raise invalid_request(_PROMPT_FORMS, param="prompt")
