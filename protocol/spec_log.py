"""The spec-log line format: written by ``openinfer-engine --spec-log``, read by the checkers."""

from __future__ import annotations

import msgspec

from openinfer.protocol.counters import CONFIDENCE_SCALE, MAX_SPEC_TOKENS, SpecDecodeCounters


class SpecLogLine(msgspec.Struct):
    """One round: what the drafter proposed, what the target verified and how much of it reached the output
    (docs/design.md, verification log).

    A line with ``num_draft_tokens`` >= 1 is a draft; one with ``num_draft_tokens`` 0 is a round whose
    ``num_proposed_tokens`` the scheduler left out entirely (no draft; only the unverified count moves).
    ``confidence_micros`` holds the drafter's confidence in each verified token as round(c * 1e6), exactly
    the integers the engine counted (empty from a drafter without a confidence head).
    Readers allow more fields than these.
    """

    time: float  # unix seconds
    engine_index: int
    incarnation: str  # 16 hex digits
    request_id: str
    num_spec_tokens: int  # K of the drafter that made the draft
    num_draft_tokens: int  # V: the draft tokens verified
    num_accepted: int
    # seq of the engine's first message sent after the line was written: the first load snapshot whose
    # counters hold this draft (every later one does too). None in logs of releases before it was written.
    seq: int | None = None
    # P: the tokens the drafter proposed, V of them verified. None in logs of releases before it was
    # written (every proposal was verified whole then: P = V).
    num_proposed_tokens: int | None = None
    # round(c_i * 1e6) for each of the V verified tokens, or empty (no confidence head; older releases).
    confidence_micros: list[int] = []

    @property
    def num_proposed(self) -> int:
        """P, also for lines of releases that did not write it."""
        return self.num_draft_tokens if self.num_proposed_tokens is None else self.num_proposed_tokens

    def observe_into(self, counters: SpecDecodeCounters) -> None:
        """Count this round into ``counters`` (of its K) as the engine counted it: one ``observe_*`` call."""
        num_unverified = self.num_proposed - self.num_draft_tokens
        if self.num_draft_tokens == 0:
            counters.observe_unverified(num_unverified)
        else:
            # m / 1e6 is the double nearest it, so observe_draft's round(c * 1e6) gives m back exactly.
            confidence = [m / CONFIDENCE_SCALE for m in self.confidence_micros] or None
            counters.observe_draft(self.num_draft_tokens, self.num_accepted, num_unverified, confidence)


_DECODER = msgspec.json.Decoder(SpecLogLine)


def parse_spec_log_line(line: str | bytes) -> SpecLogLine:
    """Decode one spec-log line; ``ValueError`` saying why when it is not a possible round."""
    try:
        draft = _DECODER.decode(line)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ValueError(str(e)) from None
    k, drafted, accepted = draft.num_spec_tokens, draft.num_draft_tokens, draft.num_accepted
    proposed = draft.num_proposed
    if draft.engine_index < 0:
        raise ValueError(f"negative engine_index {draft.engine_index}")
    if not 0 <= accepted <= drafted <= k <= MAX_SPEC_TOKENS:
        raise ValueError(f"impossible draft: {accepted} accepted of {drafted} tokens with K={k}")
    if not drafted <= proposed <= k or proposed < 1:
        raise ValueError(f"impossible round: {drafted} tokens verified of {proposed} proposed with K={k}")
    micros = draft.confidence_micros
    if micros and (len(micros) != drafted or not all(0 <= m <= CONFIDENCE_SCALE for m in micros)):
        raise ValueError(
            f"impossible confidences: {micros} for {drafted} verified tokens (one each, in 0..{CONFIDENCE_SCALE})"
        )
    return draft
