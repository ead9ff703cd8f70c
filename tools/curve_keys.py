"""``openinfer-keys DIR``: CurveZMQ keys for the engine sockets, made by
:func:`openinfer.frontend.engines.server_keys.make_keys` in the layout it describes and loads (the engines
load their own pair)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from openinfer.frontend.engines.server_keys import make_keys


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``openinfer-keys``."""
    parser = argparse.ArgumentParser(
        prog="openinfer-keys",
        description="Make CurveZMQ keys for --zmq-curve-keys DIR: a frontend key pair and one per engine.",
    )
    parser.add_argument("dir", type=Path, help="folder to write the keys into (created if missing)")
    parser.add_argument("--engines", type=int, default=1, help="engine key pairs to make (engine-0 ...)")
    args = parser.parse_args(argv)
    if args.engines < 1:
        parser.error("--engines must be >= 1")
    try:
        written = make_keys(args.dir, args.engines)
    except (ValueError, OSError) as e:
        print(f"openinfer-keys: {e}", file=sys.stderr)
        sys.exit(1)
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
