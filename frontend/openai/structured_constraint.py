"""A request's structured-output constraint (:class:`StructuredConstraint`): what the request parsing makes
and the server's :class:`~openinfer.frontend.openai.structured_outputs_config.StructuredOutputsConfig` adjusts.

Its own module, importing neither aiohttp nor the request parsing, so that both of those can import it.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from openinfer.protocol import StructuredOutputs


@dataclass(frozen=True)
class StructuredConstraint:
    """A request's output constraint, and the body field a 400 about it names."""

    outputs: StructuredOutputs  # start_after_token_id None: the chat request knows where reasoning ends
    param: str  # "response_format", "structured_outputs", or "tools" for a forced tool call

    def engine_outputs(self, start_after_token_id: int | None) -> StructuredOutputs:
        """The engine's constraint, applied after ``start_after_token_id`` (chat's ``</think>`` where the
        output starts in reasoning; None: from the first output token)."""
        return msgspec.structs.replace(self.outputs, start_after_token_id=start_after_token_id)
