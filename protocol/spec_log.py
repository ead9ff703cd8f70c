"""The spec-log line format: written by ``openinfer-engine --spec-log``, read by the checkers."""

from __future__ import annotations

import msgspec

from openinfer.protocol.counters import MAX_SPEC_TOKENS


class SpecLogLine(msgspec.Struct):
    """One draft: what was proposed and how much of it reached the output (DESIGN.md, verification log).

    Readers allow more fields than these.
    """

    time: float  # unix seconds
    engine_index: int
    incarnation: str  # 16 hex digits
    request_id: str
    num_spec_tokens: int  # K of the drafter that made the draft
    num_draft_tokens: int
    num_accepted: int
    # seq of the engine's first message sent after the line was written: the first load snapshot whose
    # counters hold this draft (every later one does too). None in logs of releases before it was written.
    seq: int | None = None


_DECODER = msgspec.json.Decoder(SpecLogLine)


def parse_spec_log_line(line: str | bytes) -> SpecLogLine:
    """Decode one spec-log line; ``ValueError`` saying why when it is not a possible draft."""
    try:
        draft = _DECODER.decode(line)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ValueError(str(e)) from None
    k, drafted, accepted = draft.num_spec_tokens, draft.num_draft_tokens, draft.num_accepted
    if draft.engine_index < 0:
        raise ValueError(f"negative engine_index {draft.engine_index}")
    if not 0 <= accepted <= drafted <= k <= MAX_SPEC_TOKENS or drafted < 1:
        raise ValueError(f"impossible draft: {accepted} accepted of {drafted} tokens with K={k}")
    return draft
