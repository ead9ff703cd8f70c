"""vLLM's ``--structured-outputs-config``: the server's side of structured outputs, and its flag.

Its own module, importing neither aiohttp nor the request parsing, so that ``openinfer-serve`` can read the
frontend's flags (:mod:`openinfer.frontend.process.flags`) without loading the HTTP server.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass

import msgspec

from openinfer.frontend.openai.structured_constraint import StructuredConstraint


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """The server's side of structured outputs: vLLM's ``--structured-outputs-config``, as far as openinfer
    has it (the backend is always xgrammar)."""

    disable_any_whitespace: bool = False  # JSON constraints are compact for every request

    @classmethod
    def parse(cls, text: str) -> StructuredOutputsConfig:
        """From the flag's JSON object; ValueError naming what is wrong."""
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--structured-outputs-config must be a JSON object: {e}") from None
        if not isinstance(fields, dict):
            raise ValueError("--structured-outputs-config must be a JSON object")
        unknown = set(fields) - {"backend", "disable_any_whitespace"}
        if unknown:
            raise ValueError(
                f"--structured-outputs-config: openinfer has no {', '.join(sorted(unknown))} (it has backend "
                "and disable_any_whitespace)"
            )
        if fields.get("backend", "auto") not in ("auto", "xgrammar"):
            raise ValueError("--structured-outputs-config: openinfer's backend is xgrammar (or auto)")
        disable = fields.get("disable_any_whitespace", False)
        if not isinstance(disable, bool):
            raise ValueError("--structured-outputs-config: disable_any_whitespace must be true or false")
        return cls(disable_any_whitespace=disable)

    def applied(self, constraint: StructuredConstraint | None) -> StructuredConstraint | None:
        """A request's constraint (None: none) with the server's settings on it: what the grammar check
        compiles is what the engine gets."""
        if constraint is None or not self.disable_any_whitespace:
            return constraint
        outputs = msgspec.structs.replace(constraint.outputs, any_whitespace=False)
        return dataclasses.replace(constraint, outputs=outputs)

    def argv(self) -> list[str]:
        """The flag that gives this config, for a command line (none for the default)."""
        if self == StructuredOutputsConfig():
            return []
        return [
            "--structured-outputs-config",
            json.dumps({"disable_any_whitespace": self.disable_any_whitespace}),
        ]


def add_structured_outputs_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--structured-outputs-config",
        type=_config_arg,
        default=StructuredOutputsConfig(),
        metavar="JSON",
        help="vLLM's structured outputs settings, e.g. '{\"disable_any_whitespace\": true}': JSON constraints "
        "without whitespace between tokens for every request (a model that drifts into whitespace cannot)",
    )


def _config_arg(text: str) -> StructuredOutputsConfig:
    try:
        return StructuredOutputsConfig.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
