"""What the checks before decoding need to know of a request body, found without decoding it: the size in
bytes of the JSON of each number field, and how many values the body holds.

Decoding holds the GIL for as long as it runs and costs per value (an empty object about 70 times a string's
byte), so a body of millions of tiny values, or a field of millions of numbers, would stall the event loop.
Values are counted by the commas between them, outside strings: in valid JSON every item of a list or an
object but the first follows one (so ``n`` commas mean about ``n`` values, at most ``2n`` plus the nesting
depth counting the lists and objects themselves).

Taking the census costs about 6 ms per MiB (a regular expression empties the strings; ``msgspec.Raw`` finds
the number fields without building them), so a body larger than :data:`INLINE_BYTES` is counted in a worker
process (``python -m`` this module: it reads bodies from stdin, each as an 8-byte big-endian length and its
bytes, and answers each with its census as one JSON line), and the loop only copies it into a pipe.
"""

from __future__ import annotations

import asyncio
import re
import sys

import msgspec

INLINE_BYTES = 1 << 20  # bodies up to this size are counted on the event loop (at most about 6 ms)
# A JSON string: its quotes, and anything but a quote or a backslash, or an escaped character, between them.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# A prompt's JSON that is text: a string, or a list that starts with one (a batch of one text)
_TEXT_PROMPT = re.compile(rb'(\[\s*)?"')
_LENGTH_BYTES = 8


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
    """The census of ``body`` (a body that is not an object, or is nested past msgspec's depth, has no number
    fields: the body's own decoder says what is wrong with it)."""
    commas = _STRING.sub(b'""', body).count(b",")
    try:
        fields = msgspec.json.decode(body, type=_NumberFields)
    except (msgspec.ValidationError, RecursionError):
        return BodyCensus(commas=commas)
    except msgspec.DecodeError as e:
        return BodyCensus(not_json=str(e))
    prompt = fields.prompt
    prompt_bytes = 0 if _TEXT_PROMPT.match(memoryview(prompt)) else len(prompt)
    return BodyCensus(prompt_bytes, len(fields.logit_bias), len(fields.stop_token_ids), commas)


class CensusWorker:
    """Takes the census of large bodies in one worker process, started on first need and kept; censuses
    wait their turn. One takes about 0.2 s for the largest body a Qwen3 model takes; one whose client leaves
    meanwhile runs to its end (the worker is then ready for the next)."""

    def __init__(self) -> None:
        self._worker: asyncio.subprocess.Process | None = None
        self._turn = asyncio.Lock()
        self._decoder = msgspec.json.Decoder(BodyCensus)

    async def take(self, body: bytes) -> BodyCensus:
        """The census of ``body``: here when it is small, else in the worker."""
        if len(body) <= INLINE_BYTES:
            return take_census(body)
        # Shielded: a census cut short would leave its answer in the pipe for the next one to read.
        return await asyncio.shield(self._take_in_turn(body))

    async def _take_in_turn(self, body: bytes) -> BodyCensus:
        async with self._turn:
            worker = self._worker
            if worker is None or worker.returncode is not None:
                worker = self._worker = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "openinfer.frontend.openai.body_census",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                )
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(len(body).to_bytes(_LENGTH_BYTES, "big"))
            worker.stdin.write(body)
            await worker.stdin.drain()
            line = await worker.stdout.readline()
            if not line:
                raise RuntimeError(f"the body census worker (pid {worker.pid}) exited; see the log above")
            return self._decoder.decode(line)

    async def close(self) -> None:
        """Stop the worker (its stdin closes: it exits) and wait for it."""
        worker, self._worker = self._worker, None
        if worker is not None and worker.returncode is None:
            assert worker.stdin is not None
            worker.stdin.close()
            await worker.wait()


def main() -> None:
    """Take the census of bodies from stdin until it closes (or the frontend dies, which closes it)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while len(header := stdin.read(_LENGTH_BYTES)) == _LENGTH_BYTES:
        census = take_census(stdin.read(int.from_bytes(header, "big")))
        stdout.write(msgspec.json.encode(census) + b"\n")
        stdout.flush()


if __name__ == "__main__":
    main()
