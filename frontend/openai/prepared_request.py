"""A parsed request made for the model that serves it: the engine request, and its endpoint's response
format (for chat, the output reader built with the same reasoning parser its prompt opened)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from openinfer.frontend.openai.response_format import FormatContext, ResponseFormat
from openinfer.protocol import EngineCoreRequest


@dataclass(frozen=True)
class PreparedRequest:
    """What one request runs as (``engine_request``) and how its output is shaped: ``response_format``
    builds the endpoint's :class:`ResponseFormat` of one choice once the response ids and prompt are known;
    each call makes a new one (a chat's with a reasoning parser of its own, which keeps state as the output
    streams)."""

    engine_request: EngineCoreRequest
    response_format: Callable[[FormatContext], ResponseFormat]
