"""Whether xgrammar compiles a structured-outputs constraint: the check a worker process of
:class:`~openinfer.frontend.openai.grammar_pool.GrammarCheckPool` runs (``python -m`` this module).

The check converts the constraint as the engine's compile first does (``Grammar.from_json_schema``,
``from_regex``, ``from_ebnf``), without a vocabulary: measured, the conversion is what takes long (a 150-deep
nested ``items`` schema: 0.15 s to convert, 0.02 s more to compile against Qwen3's vocabulary; a JSON
``pattern`` of ``[a-z]{12000}``: 7.4 s and 0.001 s), so a constraint that converts within the frontend's
deadline compiles about as fast on the engine.

A worker (:func:`~openinfer.frontend.openai.worker_pool.serve_lines`) reads one constraint per line on stdin
(:class:`StructuredOutputs` as JSON) and answers each with one line: ``null`` when it compiles, else the 400's
message. It imports xgrammar (and with it torch) before it says it is ready; the frontend's own process never
imports it.
"""

from __future__ import annotations

import re

import msgspec

from openinfer.frontend.openai.worker_pool import serve_lines
from openinfer.protocol import StructuredKind, StructuredOutputs

# What a 400 calls each kind the check compiles; the others (choice, json_object) always compile.
CHECKED_KINDS: dict[StructuredKind, str] = {"json": "JSON schema", "regex": "regex", "grammar": "grammar"}

# xgrammar's messages start "[21:37:49] /project/cpp/regex_converter.cc:94: " and may hold a failed check
_XGRAMMAR_PREFIX = re.compile(r"^\[[0-9:.]+\] \S+:\d+: (Check failed: .*? is false: )?")
_MAX_MESSAGE_CHARS = 2000  # xgrammar may quote the whole schema


def grammar_error(outputs: StructuredOutputs) -> str | None:
    """None when xgrammar compiles the constraint, or when xgrammar is not installed (the engine refuses
    what does not compile then); else what is wrong, in xgrammar's words without its log prefix."""
    words = CHECKED_KINDS.get(outputs.kind)
    if words is None:
        return None
    try:
        import xgrammar
    except ImportError:
        return None
    try:
        if outputs.kind == "json":
            xgrammar.Grammar.from_json_schema(outputs.spec, any_whitespace=outputs.any_whitespace)
        elif outputs.kind == "regex":
            xgrammar.Grammar.from_regex(outputs.spec)
        else:
            xgrammar.Grammar.from_ebnf(outputs.spec)
    except RuntimeError as e:
        message = _XGRAMMAR_PREFIX.sub("", str(e)).strip()[:_MAX_MESSAGE_CHARS]
        return f"the {words} does not compile: {message}"
    return None


def main() -> None:
    """Answer constraints from stdin until it closes, behind the frontend for the CPU (the constraints checked
    here are the clients' to choose); warm means xgrammar is imported."""
    decoder = msgspec.json.Decoder(StructuredOutputs)
    serve_lines(
        lambda line: msgspec.json.encode(grammar_error(decoder.decode(line))),
        warm=lambda: grammar_error(StructuredOutputs("regex", "a")),
        nice=10,
    )


if __name__ == "__main__":
    main()
