"""What an engine refuses in a request it is sent: each check says what is wrong, for the error output."""

from __future__ import annotations

import math

from openinfer.engine_core.core.kv_cache_manager import KVCacheManager
from openinfer.engine_core.core.runtime_facts import RuntimeFacts
from openinfer.engine_core.sample.logits_plan import check_logits_params
from openinfer.protocol import EngineCoreRequest


def refusal(message: EngineCoreRequest, facts: RuntimeFacts, kv_cache: KVCacheManager) -> str | None:
    """Why this engine cannot run the request, or None (the request id's uniqueness is the caller's)."""
    params = message.sampling_params
    prompt = message.prompt_token_ids
    vocab, max_model_len = facts.vocab_size, facts.max_model_len
    if not prompt:
        return "the prompt is empty"
    if any(t < 0 or t >= vocab for t in prompt):
        return f"prompt token ids must be in [0, {vocab})"
    if len(prompt) >= max_model_len:
        return f"the prompt has {len(prompt)} tokens; this model's length is {max_model_len}"
    if params.max_tokens < 1:
        return f"max_tokens must be >= 1, got {params.max_tokens}"
    if not (math.isfinite(params.temperature) and params.temperature >= 0 and 0 < params.top_p <= 1):
        return "temperature must be a finite number >= 0 and top_p in (0, 1]"
    if params.top_k is not None and params.top_k < 1:
        return f"top_k must be >= 1 or unset, got {params.top_k}"
    if params.logprobs is not None and not 0 <= params.logprobs <= vocab:
        return f"logprobs must be in [0, {vocab}] or unset, got {params.logprobs}"
    if (error := check_logits_params(params, vocab)) is not None:
        return error
    constraint = params.structured_outputs
    if constraint is not None and not 0 <= (constraint.start_after_token_id or 0) < vocab:
        return f"structured_outputs.start_after_token_id must be in [0, {vocab})"
    longest = min(len(prompt) + params.max_tokens, max_model_len)
    if kv_cache.num_blocks_for(longest) > kv_cache.num_blocks:
        return (
            f"the request needs up to {longest} tokens of KV cache but this engine holds "
            f"{kv_cache.num_blocks * kv_cache.block_size}; raise --kv-cache-gb"
        )
    return None
