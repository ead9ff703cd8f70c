"""``openinfer-keys DIR``: CurveZMQ keys for the engine sockets, in the layout that
:mod:`openinfer.frontend.engines.server_keys` describes and loads (the engines load their own pair)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import zmq
import zmq.auth

from openinfer.frontend.engines.server_keys import ENGINES_DIR, FRONTEND_KEY


def make_keys(folder: Path, num_engines: int) -> list[Path]:
    """Write a frontend key pair and ``num_engines`` engine key pairs; refuses to overwrite existing keys.

    Secret key files are 0600 from the moment they exist, and folders made here 0700.
    """
    if not zmq.has("curve"):
        raise ValueError("this libzmq was built without CURVE support")
    engines_dir = folder / ENGINES_DIR
    names = [(folder, FRONTEND_KEY)] + [(engines_dir, f"engine-{i}") for i in range(num_engines)]
    existing = [d / f"{name}.key" for d, name in names if (d / f"{name}.key").exists()]
    if existing:
        raise ValueError(f"keys exist already ({', '.join(map(str, existing))}); choose an empty folder")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    engines_dir.mkdir(mode=0o700, exist_ok=True)
    written = []
    for directory, name in names:
        # Made empty and private first: create_certificates writes into it (truncating, the mode kept), so
        # the secret key is never in a file another user could open, not even for a moment.
        os.close(os.open(directory / f"{name}.key_secret", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        public, secret = zmq.auth.create_certificates(directory, name)
        written += [Path(public), Path(secret)]
    return written


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
