"""A ``POST /v1/completions`` body, validated into the typed request the API server runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.errors import invalid_request
from openinfer.frontend.openai.request_fields import decode_object, read_token_ids, refuse_unsupported
from openinfer.frontend.openai.sampling_options import (
    MAX_LOGPROBS,
    SamplingOptions,
    parse_sampling_options,
    read_logprobs_count,
)
from openinfer.protocol import EngineCoreRequest

ONE_CHOICE = (
    "openinfer returns one choice per request: send `{}` = 1 (or leave it out) and make several requests"
)

# OpenAI / vLLM parameters openinfer does not support, with the values that mean "not used" and what to
# say about any other value: it is refused rather than silently ignored.
_UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((None, 1), ONE_CHOICE.format("n")),
    "best_of": ((None, 1), ONE_CHOICE.format("best_of")),
    "echo": ((None, False), "`echo` is not supported by openinfer"),
    "prompt_logprobs": ((None,), "`prompt_logprobs` is not supported by openinfer"),
    "suffix": ((None, ""), "`suffix` is not supported by openinfer"),
    "logit_bias": ((None, {}), "`logit_bias` is not supported by openinfer"),
    "presence_penalty": ((None, 0), "`presence_penalty` is not supported by openinfer"),
    "frequency_penalty": ((None, 0), "`frequency_penalty` is not supported by openinfer"),
    "repetition_penalty": ((None, 1), "`repetition_penalty` is not supported by openinfer"),
    "min_tokens": ((None, 0), "`min_tokens` is not supported by openinfer"),
}


@dataclass(frozen=True)
class CompletionRequest:
    """What one completion asks for: a prompt, a model and the shared sampling options."""

    prompt: str | list[int]  # text, or token ids
    model: str | None  # None: the first served model
    options: SamplingOptions

    def to_engine_request(self, model: ServedModel, request_id: str) -> EngineCoreRequest:
        """Tokenize (with the model's special tokens) and bound the request for ``model``."""
        if isinstance(self.prompt, str):
            prompt_token_ids = model.tokenizer.encode(self.prompt)
        else:
            prompt_token_ids = self.prompt
        return self.options.engine_request(model, prompt_token_ids, request_id)


def parse_completion_request(body: bytes) -> CompletionRequest:
    """Decode and validate a request body; raise :class:`ApiError` (400) naming the bad parameter."""
    fields = decode_object(body)
    refuse_unsupported(fields, _UNSUPPORTED)
    if isinstance(fields.get("logprobs"), bool):  # chat's spelling; completions take a count
        raise invalid_request(
            f"`logprobs` of a completion is the number of alternatives per token, in [0, {MAX_LOGPROBS}]",
            param="logprobs",
        )
    options = parse_sampling_options(
        fields, "max_tokens", default_max_tokens=16, logprobs=read_logprobs_count(fields, "logprobs")
    )
    model = fields.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid_request("`model` must be a string", param="model")
    return CompletionRequest(prompt=_prompt(fields), model=model, options=options)


def _prompt(fields: dict[str, Any]) -> str | list[int]:
    """One prompt: a string, token ids, or a one-element list of either."""
    if "prompt" not in fields or fields["prompt"] is None:
        raise invalid_request("`prompt` is required", param="prompt")
    prompt = fields["prompt"]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > 1:
            raise invalid_request(
                f"got {len(prompt)} prompts; openinfer takes one prompt per request for now", param="prompt"
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid_request("`prompt` must not be empty", param="prompt")
        return prompt
    if isinstance(prompt, list):
        if not prompt:
            raise invalid_request("`prompt` must not be empty", param="prompt")
        return read_token_ids(prompt, "prompt")
    raise invalid_request(
        "`prompt` must be a string, a list of token ids, or a list of one of those", "prompt"
    )
