#!/usr/bin/env bash
# Everything GPU-related in one run on a CUDA machine: the gpu-marked tests, model-step timings and serving
# throughput on the GPU. Logs and tables go to $OUT (default /tmp/gpu_check). Packages the machine lacks
# (msgspec, pyzmq, pytest-asyncio) may travel as wheels in .whl/; the project goes on the path under its
# openinfer.* names without being installed, so nothing is fetched.
#   bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
mkdir -p /tmp/ns/openinfer
for d in protocol engine_core kernels frontend benchmarks; do ln -sfn "$PWD/$d" "/tmp/ns/openinfer/$d"; done
export PYTHONPATH=/tmp/site:/tmp/ns:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())"

echo "== gpu-marked tests"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$out/gpu_tests.log" | tail -n 15

echo "== Triton attention kernels, compiled, against the torch backend"
timeout 300 python3 -m pytest -q -k triton -p no:cacheprovider tests/kernels 2>&1 | tee "$out/triton_tests.log" | tail -n 15

for backend in triton torch; do
  echo "== model step, built-in model, bfloat16, $backend attention"
  timeout 120 python3 benchmarks/engine_step.py --device cuda --dtype bfloat16 --threads 1 --iters 100 --warmup 10 \
    --attention-backend "$backend" | tee "$out/step_builtin_$backend.md"
done
python3 - <<'PY'
from pathlib import Path
from openinfer.engine_core.tiny_model import make_tiny_checkpoint
# ~170M parameters: big enough that the GPU, not Python, sets the pace of a large batch.
make_tiny_checkpoint(Path("/tmp/medium"), seed=0, init_std=0.02, overrides={
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 4096})
PY
echo "== model step, ~170M random model, bfloat16"
timeout 120 python3 benchmarks/engine_step.py --model /tmp/medium --device cuda --dtype bfloat16 --threads 1 \
  --iters 100 --warmup 10 | tee "$out/step_medium.md"

serve_bench() {  # $1: label, rest: openinfer-serve flags
  local label=$1
  shift
  python3 -m openinfer.engine_core.serve --device cuda --port 8100 --engine-port 5600 "$@" >"$out/serve_$label.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 300); do
    curl -sf http://127.0.0.1:8100/health >/dev/null 2>&1 && break
    sleep 0.2
  done
  echo "== serving: $label"
  for c in 1 8 32; do
    timeout 60 python3 -m openinfer.benchmarks.bench --base-url http://127.0.0.1:8100 --max-concurrency "$c" \
      --num-prompts 32 --random-input-len 64 --random-output-len 128 --ignore-eos --disable-tqdm \
      --json "$out/bench_${label}_c$c.json" >"$out/bench_${label}_c$c.txt"
    grep -E '^(Maximum request|Output token|Median TPOT|rounds|acceptance rate)' "$out/bench_${label}_c$c.txt"
  done
  kill -TERM "$pid"
  wait "$pid"
}
serve_bench builtin --no-spec
serve_bench builtin_dflash  # the default: the built-in DFlash drafter, K=7
serve_bench builtin_ngram --spec-method ngram --num-spec-tokens 7
serve_bench medium --model /tmp/medium
