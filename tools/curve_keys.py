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
from openinfer.tools.private_file import CREATE, open_private

KEY_SUFFIXES = (".key", ".key_secret")  # zmq.auth.create_certificates' public and secret key files


def make_keys(folder: Path, num_engines: int) -> list[Path]:
    """Write a frontend key pair and ``num_engines`` engine key pairs; refuses to overwrite existing keys.

    Key files are 0600 from the moment they exist, and folders made here 0700.
    """
    if not zmq.has("curve"):
        raise ValueError("this libzmq was built without CURVE support")
    engines_dir = folder / ENGINES_DIR
    names = [(folder, FRONTEND_KEY)] + [(engines_dir, f"engine-{i}") for i in range(num_engines)]
    files = [d / f"{name}{suffix}" for d, name in names for suffix in KEY_SUFFIXES]
    existing = [path for path in files if os.path.lexists(path)]  # a dangling link too
    if existing:
        raise ValueError(f"keys exist already ({', '.join(map(str, existing))}); choose an empty folder")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    engines_dir.mkdir(mode=0o700, exist_ok=True)
    for path in files:
        # Made empty, private and new first (nothing planted in its place is followed): create_certificates
        # writes into it (truncating, the mode kept), so the secret key is never in a file another user could
        # open, not even for a moment.
        os.close(open_private(path, CREATE))
    written = []
    for directory, name in names:
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
