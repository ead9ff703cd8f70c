"""What the checks before decoding need to know of a request body, found without decoding it: the size in
bytes of the JSON of each number field, and how many values the body holds.

Decoding holds the GIL for as long as it runs and costs per value (an empty object about 70 times a string's
byte), so a body of millions of tiny values, or a field of millions of numbers, would stall the event loop.
Values are counted by the commas between them, outside strings: in valid JSON every item of a list or an
object but the first follows one (so ``n`` commas mean about ``n`` values, at most ``2n`` plus the nesting
depth counting the lists and objects themselves).

A census is linear in the body, whatever its bytes: ``msgspec`` checks that it is JSON and finds the number
fields as ``msgspec.Raw`` without building them (about 2 ms per MiB), and the commas are counted with a few
passes of ``bytes`` methods (at most about 10 ms per MiB, for a body of nothing but empty strings). A body
larger than :data:`INLINE_BYTES` is counted in a worker process
(:class:`~openinfer.frontend.openai.body.census_worker.CensusWorker` runs ``python -m`` this module: it reads
bodies from stdin, each as :data:`LENGTH_BYTES` big-endian bytes of length and its bytes, and answers each
with its census as one JSON line), so the loop only copies it into a pipe.
"""

from __future__ import annotations

import re
import sys

import msgspec

INLINE_BYTES = 1 << 20  # bodies up to this size are counted on the event loop (at most about 10 ms)
LENGTH_BYTES = 8  # a body's length, before it on the worker's stdin
# A prompt's JSON that is text: a string, or a list that starts with one (a batch of one text)
_TEXT_PROMPT = re.compile(rb'(\[\s*)?"')
_WINDOW_BYTES = 1 << 16  # the commas are counted this much at a time: a body of tiny strings splits into
# millions of pieces, which in one go would take some 30 times the body's size in memory


class BodyCensus(msgspec.Struct, frozen=True):
    """A body's number fields' sizes and its values, or why it is not JSON."""

    prompt_bytes: int = 0  # the JSON of a prompt of token ids (0 for a text prompt, or none)
    logit_bias_bytes: int = 0
    stop_token_ids_bytes: int = 0
    commas: int = 0  # between values, outside strings
    not_json: str | None = None  # msgspec's words when the body is not JSON (then nothing else is counted)


class _NumberFields(msgspec.Struct):
    """The fields made of numbers, as the JSON they are (a body's other fields are skipped)."""

    prompt: msgspec.Raw = msgspec.Raw()
    logit_bias: msgspec.Raw = msgspec.Raw()
    stop_token_ids: msgspec.Raw = msgspec.Raw()


def take_census(body: bytes) -> BodyCensus:
    """The census of ``body``. One that is not JSON is said so and nothing more; one that is not an object,
    or nests past msgspec's depth, has no number fields (the body's own decoder says what is wrong with it)
    but its commas are counted all the same, as they bound what that decoder would decode."""
    try:
        fields = msgspec.json.decode(body, type=_NumberFields)
    except (msgspec.ValidationError, RecursionError):  # msgspec stopped early: maybe not JSON after it
        return BodyCensus(commas=commas_outside_strings(body))
    except msgspec.DecodeError as e:
        return BodyCensus(not_json=str(e))
    prompt = fields.prompt
    prompt_bytes = 0 if _TEXT_PROMPT.match(memoryview(prompt)) else len(prompt)
    return BodyCensus(
        prompt_bytes, len(fields.logit_bias), len(fields.stop_token_ids), commas_outside_strings(body)
    )


def commas_outside_strings(body: bytes) -> int:
    """The commas of JSON ``body`` outside its strings, in time linear in its size whatever it holds (for
    bytes that are not JSON the count means nothing, but takes no longer)."""
    # Inside a JSON string a quote is escaped (\") and so is a backslash (\\). Without those pairs, taken
    # left to right as JSON pairs them, every quote left opens or closes a string.
    plain = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    commas = 0
    inside = 0  # 1 when a window starts inside a string
    for start in range(0, len(plain), _WINDOW_BYTES):
        pieces = plain[start : start + _WINDOW_BYTES].split(b'"')  # outside, inside, outside, ... strings
        commas += b"".join(pieces[inside::2]).count(b",")
        inside ^= (len(pieces) - 1) & 1  # an odd number of quotes in the window
    return commas


def main() -> None:
    """Take the census of bodies from stdin until it closes (or the frontend dies, which closes it)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while len(header := stdin.read(LENGTH_BYTES)) == LENGTH_BYTES:
        census = take_census(stdin.read(int.from_bytes(header, "big")))
        stdout.write(msgspec.json.encode(census) + b"\n")
        stdout.flush()


if __name__ == "__main__":
    main()
