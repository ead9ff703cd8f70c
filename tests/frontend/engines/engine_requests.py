"""Engine requests the engine-client tests send straight to ``EngineClient.add_request``."""

from __future__ import annotations

from openinfer.protocol import EngineCoreRequest, SamplingParams


def make_request(request_id: str, max_tokens: int = 3, prompt: list[int] | None = None) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, prompt or [50, 60, 70], SamplingParams(max_tokens=max_tokens))
