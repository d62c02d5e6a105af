#!/usr/bin/env bash
# GPU check: serve a small model with vLLM through Switchyard's launcher, replay a chat
# workload (volatile date in the system prompt) through the gateway with prompt shaping off
# and on, and print vLLM's own prefix-cache hit rate and TTFT for both.
#
# Needs: an NVIDIA GPU, `pip install -e '.[local]'` (vLLM), and the model's weights in the
# Hugging Face cache (or network access to fetch them, or MODEL=/path/to/weights).
#
#   local_backend/vllm/gpu_check.sh [MODEL]
#
# Without a GPU: DEVICE=cpu runs the same check on vLLM's CPU build, set up with the tiny
# model by tests/vllm/setup_vllm.sh (docs/local-backend.md "Try the local backend without a GPU"):
#
#   eval "$(tests/vllm/setup_vllm.sh)"
#   DEVICE=cpu VLLM_EXECUTABLE=$SWITCHYARD_VLLM_VENV/bin/vllm local_backend/vllm/gpu_check.sh "$SWITCHYARD_VLLM_MODEL"
#
# Environment (defaults): DEVICE (gpu; cpu: no nvidia-smi, --enforce-eager, CPU_KV_CACHE_GIB
# (1) GiB of KV cache), VLLM_EXECUTABLE (vllm; its interpreter must import vllm, or that of
# PYTHON), MODEL (Qwen/Qwen2.5-0.5B-Instruct), VLLM_PORT (8011),
# GATEWAY_PORT (8090), REQUESTS (200), CONCURRENCY (8), STARTUP_TIMEOUT_S (900),
# GPU_MEMORY_UTILIZATION (0.80), MAX_MODEL_LEN (8192), PYTHON (python3, or .venv/bin/python
# when present), WORKLOAD (bench/prefix_replay.py).
#
# Shaping "on": when the gateway's policy has a `shaping` section (prompt shaping is
# merged), the gateway does the reordering (policy `shaping: {enabled: true}`); until then
# the replay moves the volatile line itself (--shaping client), which is what shaping does.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MODEL=${1:-${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}}
VLLM_PORT=${VLLM_PORT:-8011}
GATEWAY_PORT=${GATEWAY_PORT:-8090}
REQUESTS=${REQUESTS:-200}
CONCURRENCY=${CONCURRENCY:-8}
STARTUP_TIMEOUT_S=${STARTUP_TIMEOUT_S:-900}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.80}
DEVICE=${DEVICE:-gpu}
VLLM_EXECUTABLE=${VLLM_EXECUTABLE:-vllm}
CPU_KV_CACHE_GIB=${CPU_KV_CACHE_GIB:-1}
if [[ "$DEVICE" == cpu ]]; then MAX_MODEL_LEN=${MAX_MODEL_LEN:-2048}; else MAX_MODEL_LEN=${MAX_MODEL_LEN:-8192}; fi
WORKLOAD=${WORKLOAD:-$ROOT/bench/prefix_replay.py}
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
SERVED=gpu-check

workdir=$(mktemp -d -t switchyard-gpu-check.XXXXXX)
vllm_pid=""
gateway_pid=""

log() { printf '[gpu_check] %s\n' "$*" >&2; }

stop_pid() {
    local pid=$1
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
}

cleanup() {
    stop_pid "$gateway_pid"
    stop_pid "$vllm_pid"
    log "logs kept in $workdir"
}
trap cleanup EXIT

wait_http() {
    local url=$1 timeout_s=$2 pid=$3 waited=0
    until curl -fs -o /dev/null "$url"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "process $pid exited before $url answered"
            return 1
        fi
        if (( waited >= timeout_s )); then
            log "$url did not answer within ${timeout_s}s"
            return 1
        fi
        sleep 2
        waited=$((waited + 2))
    done
}

if [[ "$DEVICE" != cpu ]]; then
    command -v nvidia-smi >/dev/null || { log "nvidia-smi not found: this check needs an NVIDIA GPU (or DEVICE=cpu)"; exit 2; }
fi
command -v curl >/dev/null || { log "curl not found"; exit 2; }
# vLLM may live in a venv of its own (the CPU build does): ask the executable's interpreter.
VLLM_PYTHON=$PYTHON
vllm_path=$(command -v "$VLLM_EXECUTABLE" || true)
if [[ -n "$vllm_path" && -x "$(dirname "$vllm_path")/python" ]]; then VLLM_PYTHON="$(dirname "$vllm_path")/python"; fi
if ! "$VLLM_PYTHON" -c 'import vllm' 2>/dev/null; then
    log "vllm is not importable by $VLLM_PYTHON: pip install -e '.[local]' (or DEVICE=cpu with tests/vllm/setup_vllm.sh)"
    exit 2
fi
SWITCHYARD=("$PYTHON" -m gateway)
vllm_version=$("$VLLM_PYTHON" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -n 1)
if [[ "$DEVICE" == cpu ]]; then
    log "vLLM $vllm_version; CPU: $(nproc) cores"
    device_knobs=$'enforce_eager: true\ncpu_kv_cache_gib: '"$CPU_KV_CACHE_GIB"
else
    log "vLLM $vllm_version; GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1)"
    device_knobs="gpu_memory_utilization: $GPU_MEMORY_UTILIZATION"
fi

cat >"$workdir/launch.yaml" <<EOF
executable: $VLLM_EXECUTABLE
model: $MODEL
served_model_name: $SERVED
port: $VLLM_PORT
$(printf '%b' "$device_knobs")
max_model_len: $MAX_MODEL_LEN
enable_prefix_caching: true
enable_prompt_tokens_details: true
startup_timeout_s: $STARTUP_TIMEOUT_S
max_restarts: 0
EOF

log "starting vLLM ($MODEL) on port $VLLM_PORT: $("${SWITCHYARD[@]}" local serve "$workdir/launch.yaml" --dry-run)"
(cd "$ROOT" && exec "${SWITCHYARD[@]}" local serve "$workdir/launch.yaml" --name gpu-check) >"$workdir/vllm.log" 2>&1 &
vllm_pid=$!
wait_http "http://127.0.0.1:$VLLM_PORT/health" "$STARTUP_TIMEOUT_S" "$vllm_pid" || {
    tail -n 40 "$workdir/vllm.log" >&2
    exit 1
}
log "vLLM is ready"

gateway_shaping=0
if "${SWITCHYARD[@]}" policy schema | grep -q '"shaping"'; then
    gateway_shaping=1
fi

run_mode() {
    local mode=$1 shaping_block="" client_shaping=none
    if (( gateway_shaping )); then
        if [[ "$mode" == on ]]; then
            shaping_block=$'shaping:\n  enabled: true'
        else
            shaping_block=$'shaping:\n  enabled: false'
        fi
    elif [[ "$mode" == on ]]; then
        client_shaping=client
    fi
    cat >"$workdir/policy-$mode.yaml" <<EOF
deployments:
  local:
    provider: vllm
    model: $SERVED
    base_url: http://127.0.0.1:$VLLM_PORT/v1
tiers:
  fast: [local]
$shaping_block
EOF
    (cd "$ROOT" && exec "${SWITCHYARD[@]}" serve --policy "$workdir/policy-$mode.yaml" --port "$GATEWAY_PORT") \
        >"$workdir/gateway-$mode.log" 2>&1 &
    gateway_pid=$!
    wait_http "http://127.0.0.1:$GATEWAY_PORT/healthz" 60 "$gateway_pid"
    log "replaying $REQUESTS requests (concurrency $CONCURRENCY), shaping $mode"
    "$PYTHON" "$WORKLOAD" --base-url "http://127.0.0.1:$GATEWAY_PORT/v1" --model fast \
        --metrics-url "http://127.0.0.1:$VLLM_PORT/metrics" --metrics-model "$SERVED" \
        --requests "$REQUESTS" --concurrency "$CONCURRENCY" --shaping "$client_shaping" \
        --label "shaping-$mode" --json >>"$workdir/results.jsonl"
    stop_pid "$gateway_pid"
    gateway_pid=""
}

run_mode off
run_mode on

"$PYTHON" - "$workdir/results.jsonl" "$vllm_version" "$MODEL" "$gateway_shaping" <<'EOF'
import json
import sys

path, version, model, by_gateway = sys.argv[1:5]
rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
who = "the gateway" if by_gateway == "1" else "the replay (client-side reordering)"
print(f"\nvLLM {version}, model {model}; shaping 'on' done by {who}\n")
print(f"{'run':<14}{'requests':>9}{'failed':>8}{'vLLM hit rate':>15}{'vLLM TTFT mean':>16}{'p50':>11}{'p95':>11}")
for row in rows:
    rate = row.get("vllm_prefix_cache_hit_rate")
    mean, p50, p95 = (row.get(k) for k in ("vllm_ttft_mean_ms", "vllm_ttft_p50_ms", "vllm_ttft_p95_ms"))
    fmt = lambda v: "-" if v is None else f"{v:.1f} ms"  # noqa: E731
    print(
        f"{row['label']:<14}{row['requests']:>9}{row['failed']:>8}"
        f"{'-' if rate is None else f'{100 * rate:.1f} %':>15}{fmt(mean):>16}{fmt(p50):>11}{fmt(p95):>11}"
    )
EOF
