#!/usr/bin/env bash
# Everything GPU-related in one run of at most ~8 minutes on one CUDA device, printing tables:
#   1. the gpu-marked tests (a --gpu 0 engine behind the frontend; DFlash and DSpark drafts from CUDA graphs);
#   2. the Triton kernel tests (paged and DFlash block attention, fused MoE, the recurrent gated delta rule,
#      the causal conv), compiled for this GPU (fla's gated delta test, gpu-marked in step 1, skips unless
#      `.[gdn]` is installed);
#   3. the Triton kernels' largest error against the torch paths (benchmarks/attention_check.py);
#   4. the built-in target's output tok/s at concurrency 1 and 8: no drafter, n-gram, DFlash, DSpark (their
#      drafts from CUDA graphs too), DSpark with adaptive verification;
#   5. decode-step time of a random Qwen3-4B-shaped bfloat16 model at batch 1, 8, 64 against the HBM floor,
#      eager and from CUDA graphs (benchmarks/gpu_step.py);
#   6. the engine's host overhead per step on this machine's CPU, batch 1, 8, 64 (benchmarks/engine_step.py);
#   7. the Triton fused-MoE kernel on a Qwen3-30B-A3B-shaped bfloat16 layer, decode 1-64 and prefill 256/2048
#      tokens, against its memory floor, eager and from a CUDA graph (benchmarks/moe_kernel.py);
#   8. decode-step time of a random Qwen3.5-4B-shaped bfloat16 model (24 Gated DeltaNet and 8 full-attention
#      layers) at batch 1, 8, 64 against its HBM floor, eager and from CUDA graphs (benchmarks/gpu_step.py).
# Arguments pick steps (default: all), e.g. `bash benchmarks/gpu_check.sh 1 4`.
# Everything printed also goes to $OUT/gpu_check.log and the other logs into $OUT/logs.tar.gz (default OUT:
# /tmp/gpu_check): two files to bring back. Run it with a 480 s limit; each step has its own timeout.
# Packages the machine lacks (msgspec, pyzmq, pytest-asyncio, xgrammar, openai, ...) travel as wheels in .whl/
# (`bash benchmarks/gpu_wheels.sh` downloads them);
# the project goes on the path under its openinfer.* names without being installed, so nothing is fetched.
# Without CUDA it stops at once with exit status 2.
#   bash benchmarks/gpu_check.sh [STEP...]
set -uo pipefail
steps=" ${*:-1 2 3 4 5 6 7 8} "
want() { [[ $steps == *" $1 "* ]]; }
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out/logs"
exec > >(tee "$out/gpu_check.log") 2>&1
trap 'tar -czf "$out/logs.tar.gz" -C "$out" logs' EXIT
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
mkdir -p /tmp/ns/openinfer
for d in protocol engine_core kernels frontend benchmarks tools; do ln -sfn "$PWD/$d" "/tmp/ns/openinfer/$d"; done
export PYTHONPATH=/tmp/site:/tmp/ns:$PWD PYTHONUNBUFFERED=1
if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check.sh: no CUDA device (torch.cuda.is_available() is false); nothing to check here" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

if want 1; then
  echo "== 1. gpu-marked tests"
  timeout 150 python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors -m gpu -rfE tests 2>&1 \
    | tee "$out/logs/gpu_tests.log" | tail -n 12
fi
if want 2; then
  echo "== 2. Triton kernel tests, compiled"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -k triton tests/kernels tests/engine_core/worker/test_step_graphs.py \
    tests/engine_core/spec_decode/test_dflash_graphs.py 2>&1 | tee "$out/logs/triton_tests.log" | tail -n 5
fi
if want 3; then
  echo "== 3. Triton attention (paged, DFlash block) against the torch paths"
  timeout 60 python3 benchmarks/attention_check.py
fi

stop_serve() {  # $1: the launcher's pid; SIGTERM ends its children, SIGKILL after 10 s
  kill -TERM "$1"
  for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null
  wait "$1"
}
serve_bench() {  # $1: label, rest: openinfer-serve flags
  local label=$1
  shift
  python3 -m openinfer.engine_core.launch.serve --device cuda --port 8100 --engine-port 5600 "$@" \
    >"$out/logs/serve_$label.log" 2>&1 &
  local pid=$!
  if ! timeout 90 python3 - <<'PY'; then  # no curl needed: wait for /health
import time, urllib.request
while True:
    try:
        urllib.request.urlopen("http://127.0.0.1:8100/health", timeout=1)
        break
    except OSError:
        time.sleep(0.2)
PY
    echo "| $label | - | not up in 90 s: $(grep -m 1 -E 'Error|error:' "$out/logs/serve_$label.log") |"
    stop_serve "$pid"
    return
  fi
  # warm-up at both concurrencies first: Triton compiles and graph captures must not land in the figures
  for c in 1 8; do
    timeout 60 python3 -m openinfer.benchmarks.bench --base-url http://127.0.0.1:8100 --max-concurrency "$c" \
      --num-prompts "$c" --random-input-len 64 --random-output-len 64 --ignore-eos --disable-tqdm >/dev/null
  done
  for c in 1 8; do
    timeout 30 python3 -m openinfer.benchmarks.bench --base-url http://127.0.0.1:8100 --max-concurrency "$c" \
      --num-prompts $((c * 4)) --random-input-len 64 --random-output-len 256 --ignore-eos --disable-tqdm \
      >"$out/logs/bench_${label}_c$c.txt"
    local tps
    tps=$(grep -E '^Output token throughput' "$out/logs/bench_${label}_c$c.txt" | grep -oE '[0-9.]+' | head -n 1)
    echo "| $label | $c | ${tps:-failed} |"
  done
  stop_serve "$pid"
}
if want 4; then
  echo "== 4. serving the built-in pair on the GPU (output tok/s)"
  echo "| drafter | concurrency | output tok/s |"
  echo "|---|---:|---:|"
  serve_bench none --no-spec
  serve_bench ngram --spec-method ngram --num-spec-tokens 7
  serve_bench dflash  # the default: the built-in DFlash drafter, K=7
  serve_bench dspark --spec-method dspark  # the built-in DSpark drafter, K=7
  serve_bench dspark-adaptive --spec-method dspark --enable-adaptive-verification
fi

if want 5; then
  echo "== 5. decode step, random Qwen3-4B shape, bfloat16"
  timeout 150 python3 benchmarks/gpu_step.py --qwen3-4b /tmp/qwen3-4b --batch-sizes 1 8 64
fi
if want 6; then
  echo "== 6. host overhead per engine step (built-in model on the GPU, CUDA graphs)"
  timeout 60 python3 benchmarks/engine_step.py --device cuda --steps 50 2>&1 | tee "$out/logs/engine_step.log"
fi
if want 7; then
  echo "== 7. fused-MoE kernel, Qwen3-30B-A3B layer shape, bfloat16"
  timeout 45 python3 benchmarks/moe_kernel.py --iters 10
fi
if want 8; then
  echo "== 8. decode step, random Qwen3.5-4B shape (hybrid Gated DeltaNet), bfloat16"
  timeout 150 python3 benchmarks/gpu_step.py --qwen3-5-4b /tmp/qwen3_5-4b --batch-sizes 1 8 64
fi
