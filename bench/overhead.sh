#!/usr/bin/env bash
# Gateway overhead: the same wrk load straight at a canned nginx upstream and through
# Switchyard (and, with --litellm, through LiteLLM's proxy), at concurrency 1, 16 and 64,
# non-stream and stream. Prints a table and writes JSON. See bench/README.md.
# Modes `responses` and `resp-stream` post the same conversation to the gateway's
# /v1/responses (translated to chat for the canned upstream); they run on the gateway only
# and are compared with the direct run of `nonstream` / `stream` in the same round.
#
# --full adds a second gateway with every feature on (shaping, routing through the classifier,
# prices); the first then runs as a pass-through (shaping off, the model named directly), or,
# with --full-minus FEATURE, as the full one without that feature (what it costs, side by side).
# --floor adds the floor of a Python hop (bench/floor.py): the least a proxy does per request,
# on aiohttp's server (`floor`) and on a bare asyncio Protocol (`floor-raw`), with the
# gateway's own upstream client. --peers adds Portkey's gateway (Node). --hold N holds N SSE
# streams open at once through every target (bench/hold.py) and reports completions, time to
# first byte and peak RSS.
# --cache adds a gateway with the response cache on (`cache`, the gateway's policy plus
# `cache: {enabled: true}`) and two modes of deterministic requests (temperature 0) through
# direct, gateway (cache off) and cache: `cache-hit`, one body again and again (stored by the
# warm-up), and `cache-miss`, every body different (a counter in the prompt), so every one
# is a miss and a store. The report adds the response cache's targets (issue 55).
#
# Usage: bash bench/overhead.sh [--litellm] [--peers] [--floor] [--full] [--full-minus shaping|routing|prices] [--cache]
#                               [--workers N] [--duration S]
#                               [--out FILE] [--warmup S] [--concurrency "1 16 64"]
#                               [--stream-concurrency "16 64"] [--modes "nonstream stream"|none]
#                               [--hold N] [--hold-ramp S]
#                               [--repeat N] [--wrk-threads N] [--baseline FILE] [--strict] [--keep]
#                               [--profile] [--wait-quiet S] [--key none|unlimited|limited]
#
# Environment: VENV (the venv whose bin/switchyard to run), SWITCHYARD (the binary itself),
# NGINX (default /usr/sbin/nginx), WRK (default wrk), PYTHON (runs report.py, default python3),
# LITELLM_VENV (default bench/.litellm-venv), LITELLM_SPEC (default 'litellm[proxy]==1.108.7'),
# PORTKEY_DIR (default bench/.portkey), NODE, NPM (default node, npm on PATH),
# PY_SPY (for --profile; default: py-spy next to switchyard, else on PATH), HOLD_PYTHON (runs
# bench/hold.py and bench/floor.py; default: the python next to switchyard).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$BENCH_DIR")

USE_LITELLM=0
USE_PEERS=0
USE_FLOOR=0
USE_FULL=0
FULL_MINUS=""
USE_CACHE=0
HOLD_STREAMS=0
HOLD_RAMP_S=2
STREAM_CONCURRENCY=""
WORKERS=1
DURATION_S=10
WARMUP_S=3
CONCURRENCY="1 16 64"
MODES="nonstream stream"
OUT=""
BASELINE=""
STRICT=0
KEEP=0
WRK_THREADS=1
REPEAT=1
PROFILE=0
WAIT_QUIET_S=0
KEY_MODE=none

usage() {
  # The comment block at the top of this file.
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
}

die() {
  echo "overhead.sh: $*" >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --litellm) USE_LITELLM=1 ;;
    --peers) USE_PEERS=1 ;;
    --floor) USE_FLOOR=1 ;;
    --full) USE_FULL=1 ;;
    --cache) USE_CACHE=1 ;;
    --full-minus) FULL_MINUS=${2:?--full-minus needs shaping, routing or prices}; USE_FULL=1; shift ;;
    --hold) HOLD_STREAMS=${2:?--hold needs a number of streams}; shift ;;
    --hold-ramp) HOLD_RAMP_S=${2:?--hold-ramp needs seconds}; shift ;;
    --stream-concurrency) STREAM_CONCURRENCY=${2:?--stream-concurrency needs a list}; shift ;;
    --workers) WORKERS=${2:?--workers needs a number}; shift ;;
    --duration) DURATION_S=${2:?--duration needs seconds}; shift ;;
    --warmup) WARMUP_S=${2:?--warmup needs seconds}; shift ;;
    --concurrency) CONCURRENCY=${2:?--concurrency needs a list}; shift ;;
    --modes) MODES=${2:?--modes needs a list}; shift ;;
    --out) OUT=${2:?--out needs a file}; shift ;;
    --baseline) BASELINE=${2:?--baseline needs a file}; shift ;;
    --wrk-threads) WRK_THREADS=${2:?--wrk-threads needs a number}; shift ;;
    --repeat) REPEAT=${2:?--repeat needs a number}; shift ;;
    --strict) STRICT=1 ;;
    --keep) KEEP=1 ;;
    --profile) PROFILE=1 ;;
    --wait-quiet) WAIT_QUIET_S=${2:?--wait-quiet needs seconds}; shift ;;
    --key) KEY_MODE=${2:?--key needs none, unlimited or limited}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument: $1 (try --help)" ;;
  esac
  shift
done

[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer"
[[ $DURATION_S =~ ^[1-9][0-9]*$ ]] || die "--duration must be whole seconds"
[[ $WARMUP_S =~ ^[0-9]+$ ]] || die "--warmup must be whole seconds"
[[ $WRK_THREADS =~ ^[1-9][0-9]*$ ]] || die "--wrk-threads must be a positive integer"
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "--repeat must be a positive integer"
[[ $WAIT_QUIET_S =~ ^[0-9]+$ ]] || die "--wait-quiet must be whole seconds"
[[ $KEY_MODE == none || $KEY_MODE == unlimited || $KEY_MODE == limited ]] || die "--key: none, unlimited or limited"
[[ -z $FULL_MINUS || $FULL_MINUS =~ ^(shaping|routing|prices)$ ]] ||
  die "--full-minus: shaping, routing or prices, not '$FULL_MINUS'"
[[ $HOLD_STREAMS =~ ^[0-9]+$ ]] || die "--hold must be a whole number of streams"
[[ $HOLD_RAMP_S =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--hold-ramp must be seconds"
# --modes none: no wrk runs (e.g. only --hold).
[[ $MODES == none ]] && MODES=""
for m in $MODES; do
  [[ $m == nonstream || $m == stream || $m == responses || $m == resp-stream || $m == cache-hit || $m == cache-miss ]] ||
    die "--modes: unknown mode '$m' (nonstream, stream, responses, resp-stream, cache-hit, cache-miss)"
  [[ $m != cache-* || $USE_CACHE == 1 ]] || die "--modes $m needs --cache"
done
# --cache runs its two modes after the others (unless --modes names them).
if [[ $USE_CACHE == 1 ]]; then
  for m in cache-hit cache-miss; do
    [[ " $MODES " == *" $m "* ]] || MODES="${MODES:+$MODES }$m"
  done
fi
is_cache_mode() { [[ $1 == cache-hit || $1 == cache-miss ]]; }
for c in $CONCURRENCY $STREAM_CONCURRENCY; do
  [[ $c =~ ^[1-9][0-9]*$ ]] || die "--concurrency: not a number: '$c'"
done
# mode_concurrency MODE: the connection counts a mode runs at (--stream-concurrency for the
# stream modes when given, else --concurrency).
mode_concurrency() {
  if [[ -n $STREAM_CONCURRENCY && ($1 == stream || $1 == resp-stream) ]]; then
    echo "$STREAM_CONCURRENCY"
  else
    echo "$CONCURRENCY"
  fi
}

# --- tools -------------------------------------------------------------------------------

NGINX=${NGINX:-/usr/sbin/nginx}
WRK=${WRK:-$(command -v wrk || true)}
if [[ -z ${SWITCHYARD:-} ]]; then
  if [[ -n ${VENV:-} && -x $VENV/bin/switchyard ]]; then
    SWITCHYARD=$VENV/bin/switchyard
  elif [[ -n ${VIRTUAL_ENV:-} && -x $VIRTUAL_ENV/bin/switchyard ]]; then
    SWITCHYARD=$VIRTUAL_ENV/bin/switchyard
  elif command -v switchyard >/dev/null 2>&1; then
    SWITCHYARD=$(command -v switchyard)
  elif [[ -x $REPO_ROOT/.venv/bin/switchyard ]]; then
    SWITCHYARD=$REPO_ROOT/.venv/bin/switchyard
  else
    SWITCHYARD=""
  fi
fi
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=$(command -v python3 || true)
  [[ -z $PYTHON && -n $SWITCHYARD ]] && PYTHON=$(dirname "$SWITCHYARD")/python
fi
# Checked now, not after the runs: the report would fail on it and write no results.
if [[ -n $BASELINE ]]; then
  [[ -n $PYTHON ]] || die "python3 not found (set PYTHON)"
  "$PYTHON" -c 'import json, sys; sys.exit(not isinstance(json.load(open(sys.argv[1])).get("summary"), list))' \
    "$BASELINE" 2>/dev/null ||
    die "--baseline $BASELINE: not a result of this script (its --out JSON); bench/baseline.json belongs to 'switchyard bench'"
fi
LITELLM_VENV=${LITELLM_VENV:-$BENCH_DIR/.litellm-venv}
LITELLM_SPEC=${LITELLM_SPEC:-litellm[proxy]==1.108.7}
PORTKEY_DIR=${PORTKEY_DIR:-$BENCH_DIR/.portkey}
NODE=${NODE:-$(command -v node || true)}
NPM=${NPM:-$(command -v npm || true)}

[[ -x $NGINX ]] || die "nginx not found at $NGINX (apt-get install nginx-light, or set NGINX)"
[[ -n $WRK && -x $WRK ]] || die "wrk not found (apt-get install wrk, or set WRK)"
[[ -n $SWITCHYARD && -x $SWITCHYARD ]] || die "switchyard not found: set VENV=<venv> or SWITCHYARD=<path>, or put it on PATH"
[[ -n $PYTHON ]] || die "python3 not found (set PYTHON)"
command -v curl >/dev/null 2>&1 || die "curl not found"
if [[ $USE_PEERS == 1 ]]; then
  [[ -n $NODE && -x $NODE && -n $NPM && -x $NPM ]] ||
    die "--peers needs node (>= 18) and npm: apt-get install nodejs npm (or set NODE and NPM)"
fi
# The Python that runs bench/hold.py needs aiohttp, and bench/floor.py the gateway itself:
# the gateway's own interpreter has both.
HOLD_PYTHON=${HOLD_PYTHON:-$(dirname "$SWITCHYARD")/python}
if ((HOLD_STREAMS > 0)); then
  [[ -x $HOLD_PYTHON ]] && "$HOLD_PYTHON" -c 'import aiohttp' 2>/dev/null ||
    die "--hold needs a Python with aiohttp (the gateway's venv); set HOLD_PYTHON"
fi
if [[ $USE_FLOOR == 1 ]]; then
  [[ -x $HOLD_PYTHON ]] && "$HOLD_PYTHON" -c 'import gateway, httptools, uvloop' 2>/dev/null ||
    die "--floor needs the gateway's Python (its venv, with uvloop and httptools); set HOLD_PYTHON"
fi
# wrk at c=256 and --hold 1000 need thousands of sockets (client, gateway and upstream
# sides): raise the soft limit on open files to the hard one for every process started here.
if (($(ulimit -n) < 16384)); then ulimit -n "$(ulimit -Hn)" 2>/dev/null || true; fi
need_fds=$((HOLD_STREAMS * 3 + 1024))
(($(ulimit -n) >= need_fds)) || log_early="WARNING: ulimit -n is $(ulimit -n); --hold $HOLD_STREAMS wants about $need_fds"
if [[ $PROFILE == 1 ]]; then
  if [[ -z ${PY_SPY:-} ]]; then
    PY_SPY=$(dirname "$SWITCHYARD")/py-spy
    [[ -x $PY_SPY ]] || PY_SPY=$(command -v py-spy || true)
  fi
  [[ -n $PY_SPY && -x $PY_SPY ]] || die "--profile needs py-spy (pip install py-spy into the gateway's venv, or set PY_SPY)"
fi

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[[ -n $OUT ]] || OUT=$BENCH_DIR/results/overhead-$STAMP.json
mkdir -p "$(dirname "$OUT")"
CLK_TCK=$(getconf CLK_TCK)

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
[[ -n ${log_early:-} ]] && log "$log_early"

# --- processes we start, and their cleanup -----------------------------------------------

WORK=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-bench.XXXXXX")
# Every service runs under setsid, so its pid is also its process group: cleanup stops
# the group (the gateway's embedded Redis and workers, LiteLLM's children) and nothing else.
STARTED=()
PROFILERS=()
WRK_PID=""
FAILED=0

stop_group() {
  local pgid=$1 i
  kill -TERM -- "-$pgid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    kill -0 -- "-$pgid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL -- "-$pgid" 2>/dev/null || true
}

# shellcheck disable=SC2329  # invoked by the EXIT trap
cleanup() {
  local rc=$? pgid i
  trap - EXIT INT TERM
  [[ -n $WRK_PID ]] && kill "$WRK_PID" 2>/dev/null
  for pgid in "${PROFILERS[@]}"; do kill "$pgid" 2>/dev/null || true; done
  for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do
    pgid=${STARTED[i]}
    stop_group "$pgid"
  done
  wait 2>/dev/null || true
  if [[ $KEEP == 1 || $rc != 0 || $FAILED != 0 ]]; then
    echo "logs kept in $WORK" >&2
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME LOGFILE CMD...: run CMD in its own session; sets START_PID.
start() {
  local name=$1 logfile=$2
  shift 2
  setsid "$@" >"$logfile" 2>&1 </dev/null &
  START_PID=$!
  STARTED+=("$START_PID")
  log "started $name (pid $START_PID, log $logfile)"
}

# wait_http URL SECONDS PID: until URL answers 2xx; fails if PID exits first.
wait_http() {
  local url=$1 secs=$2 pid=$3 deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do
    kill -0 "$pid" 2>/dev/null || return 1
    curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "timed out after ${secs}s waiting for $url" >&2
  return 1
}

http_status() { curl -sS -o /dev/null -w '%{http_code}' --max-time 2 "$1" 2>/dev/null || true; }

# group_cpu PGID: "APP_TICKS OTHER_TICKS" summed over the live processes of a group
# (utime+stime from /proc/PID/stat); OTHER is redis-server (the gateway's embedded Redis).
group_cpu() {
  local pgid=$1 pid comm stat rest app=0 other=0 ticks
  while read -r pid comm; do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    rest=${stat##*) }
    # shellcheck disable=SC2086
    set -- $rest
    ticks=$((${12} + ${13}))
    if [[ $comm == redis-server ]]; then other=$((other + ticks)); else app=$((app + ticks)); fi
  done < <(ps -e -o pid=,pgid=,comm= | awk -v g="$pgid" '$2 == g { print $1, $3 }')
  echo "$app $other"
}

# group_rss PGID: "APP_KB OTHER_KB NPROCS" (VmRSS) over the group's processes.
group_rss() {
  local pgid=$1 pid comm kb app=0 other=0 n=0
  while read -r pid comm; do
    kb=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null) || continue
    [[ -n $kb ]] || continue
    if [[ $comm == redis-server ]]; then other=$((other + kb)); else app=$((app + kb)); n=$((n + 1)); fi
  done < <(ps -e -o pid=,pgid=,comm= | awk -v g="$pgid" '$2 == g { print $1, $3 }')
  echo "$app $other $n"
}

free_ports() {
  "$PYTHON" - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# --- is the machine quiet? -----------------------------------------------------------------

# machine_ticks: "TOTAL IDLE" jiffies of all cores (idle includes iowait).
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9, $5 + $6 }' /proc/stat; }

# busy_pct SECONDS: share of all cores busy over the next SECONDS.
busy_pct() {
  local t0 i0 t1 i1
  read -r t0 i0 <<<"$(machine_ticks)"
  sleep "$1"
  read -r t1 i1 <<<"$(machine_ticks)"
  echo $((100 * ((t1 - t0) - (i1 - i0)) / (t1 - t0 > 0 ? t1 - t0 : 1)))
}
# The load average before anything here starts: other work on the machine (in the JSON).
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
deadline=$((SECONDS + WAIT_QUIET_S))
while :; do
  BUSY_BEFORE=$(busy_pct 2)
  ((BUSY_BEFORE <= 10)) && break
  if ((SECONDS >= deadline)); then
    log "WARNING: the machine is already ${BUSY_BEFORE}% busy with other work: expect noisy numbers (see the 'other' column; --wait-quiet S waits for it)"
    break
  fi
  log "machine ${BUSY_BEFORE}% busy with other work; waiting (--wait-quiet)"
done

# --- canned upstream ----------------------------------------------------------------------

read -r JSON_PORT SSE_PORT GW_PORT LL_PORT FULL_PORT PK_PORT FLOOR_PORT RAW_PORT CACHE_PORT <<<"$(free_ports 9)"
mkdir -p "$WORK/nginx/tmp"
sed -e "s/@JSON_PORT@/$JSON_PORT/g" -e "s/@SSE_PORT@/$SSE_PORT/g" \
  "$BENCH_DIR/nginx/nginx.conf.template" >"$WORK/nginx/nginx.conf"
log "canned upstream: nginx on :$JSON_PORT (chat.completion JSON) and :$SSE_PORT (SSE, 20 chunks; /slow/v1 paced over ~5 s)"
start nginx "$WORK/nginx/stdout.log" "$NGINX" -p "$WORK/nginx/" -c "$WORK/nginx/nginx.conf"
NGINX_PID=$START_PID
if ! { wait_http "http://127.0.0.1:$JSON_PORT/v1/models" 10 "$NGINX_PID" &&
  wait_http "http://127.0.0.1:$SSE_PORT/v1/models" 10 "$NGINX_PID"; }; then
  cat "$WORK/nginx/error.log" "$WORK/nginx/stdout.log" >&2 2>/dev/null || true
  die "nginx did not start"
fi

# --- the gateway(s) -----------------------------------------------------------------------

# canned-slow (the paced stream) serves --hold; its pool is sized for every held stream at
# once (the default pool, 256 connections, would queue the rest: that would measure the
# pool size, not the gateway).
slow_pool=$((HOLD_STREAMS + 64 > 256 ? HOLD_STREAMS + 64 : 256))
# write_policy FILE pass|default|full [MINUS]: MINUS (full only) leaves out shaping, routing or prices.
write_policy() {
  local file=$1 kind=$2 minus=${3:-} price=""
  [[ $kind == full && $minus != prices ]] && price=", price: {input: 0.4, cached_input: 0.1, output: 1.6}"
  cat >"$file" <<EOF
deployments:
  canned: {base_url: "http://127.0.0.1:$JSON_PORT/v1", responses_api: translate$price}
  canned-stream: {base_url: "http://127.0.0.1:$SSE_PORT/v1", responses_api: translate$price}
  canned-slow: {base_url: "http://127.0.0.1:$SSE_PORT/slow/v1", max_connections: $slow_pool$price}
tiers:
  fast: [canned]
  strong: [canned-stream]
  slow: [canned-slow]
EOF
  case $kind in
    pass) printf 'shaping: {enabled: false}\n' >>"$file" ;;
    full)
      [[ $minus == shaping ]] && printf 'shaping: {enabled: false}\n' >>"$file"
      # Without routing the model is named directly, as in the pass-through.
      [[ $minus == routing ]] && return
      # Every request goes through the router: features, the rules, then the shipped ngram
      # classifier. The canned upstream answers JSON or SSE by port, not by the request, so
      # the stream models are pinned to their tiers by rules (features are still extracted;
      # the classifier scores the non-stream requests), and threshold 1.0 keeps the scored
      # ones on the JSON deployment.
      cat >>"$file" <<EOF
routing:
  route_all: true
  rules:
    - {name: bench_stream, when: {model: canned-stream}, tier: strong}
    - {name: bench_slow, when: {model: canned-slow}, tier: slow}
  classifier: {name: ngram}
  threshold: 1.0
EOF
      ;;
  esac
}

ADMIN_KEY=bench-admin-key
# start_gateway NAME POLICY PORT: starts `switchyard serve`, waits until it (and every
# worker) is up; sets START_PID.
start_gateway() {
  local name=$1 policy=$2 port=$3 pid code gw_up=0 deadline n
  local args=(serve --policy "$policy" --host 127.0.0.1 --port "$port")
  [[ $WORKERS == 1 ]] || args+=(--workers "$WORKERS")
  log "$name: $SWITCHYARD ${args[*]} (embedded Redis)"
  local env=()
  # --key unlimited|limited: the gateway requires a virtual key (checked on every request,
  # cached in process); limited also gives it RPM/TPM far above the load, so every request
  # runs the Lua rate limiter in Redis and charges its tokens.
  [[ $KEY_MODE == none ]] || env=(SWITCHYARD_AUTH=keys SWITCHYARD_ADMIN_KEY=$ADMIN_KEY)
  start "$name" "$WORK/$name.log" env -u REDIS_URL "${env[@]}" "$SWITCHYARD" "${args[@]}"
  pid=$START_PID
  deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    kill -0 "$pid" 2>/dev/null || break
    code=$(http_status "http://127.0.0.1:$port/healthz")
    if [[ $code == 200 ]]; then gw_up=1; break; fi
    if [[ $code =~ ^[1-5][0-9][0-9]$ ]] &&
      [[ $(http_status "http://127.0.0.1:$port/v1/models") == 200 ]]; then
      # Listening and serving the API, but /healthz is broken: say so, and go on.
      log "WARNING: $name /healthz answered HTTP $code, /v1/models answers 200: benchmarking anyway"
      GW_HEALTHZ_WARNING="GET /healthz answered HTTP $code"
      gw_up=1
      break
    fi
    sleep 0.2
  done
  if [[ $gw_up != 1 ]]; then
    tail -n 30 "$WORK/$name.log" >&2 || true
    die "$name did not become healthy (log: $WORK/$name.log)"
  fi
  if [[ $WORKERS -gt 1 ]]; then
    # Wait until every worker has bound the port (each answers /healthz with its own pid).
    deadline=$((SECONDS + 30))
    while ((SECONDS < deadline)); do
      n=$(ps -e -o pgid=,comm= | awk -v g="$pid" '$1 == g && $2 != "redis-server"' | wc -l)
      ((n >= WORKERS + 1)) && break
      sleep 0.2
    done
    sleep 1
  fi
  log "$name up on :$port ($WORKERS worker(s))"
  START_PID=$pid
}

# create_key PORT: a virtual key for --key unlimited|limited, printed.
create_key() {
  local limits=""
  [[ $KEY_MODE == limited ]] && limits=', "rpm": 1000000000, "tpm": 1000000000000'
  curl -sS --max-time 5 -X POST "http://127.0.0.1:$1/admin/keys" \
    -H "Authorization: Bearer $ADMIN_KEY" -H 'Content-Type: application/json' \
    -d "{\"name\": \"bench\"$limits}" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["key"])'
}

# Without --full the gateway runs the default policy (shaping on, as a user gets it); with
# --full it is the pass-through next to the fully featured one; with --full-minus, the fully
# featured one without that feature.
GW_POLICY_KIND=default
[[ $USE_FULL == 1 ]] && GW_POLICY_KIND=pass
[[ -n $FULL_MINUS ]] && GW_POLICY_KIND=full
write_policy "$WORK/policy.yaml" "$GW_POLICY_KIND" "$FULL_MINUS"
start_gateway gateway "$WORK/policy.yaml" "$GW_PORT"
GW_PID=$START_PID
GW_KEY=sk-bench-dummy
FULL_PID=""
FULL_KEY=sk-bench-dummy
if [[ $USE_FULL == 1 ]]; then
  write_policy "$WORK/policy-full.yaml" full
  start_gateway full "$WORK/policy-full.yaml" "$FULL_PORT"
  FULL_PID=$START_PID
fi
# --cache: the same policy as the gateway's, with the response cache on for every deployment.
CACHE_PID=""
CACHE_KEY=sk-bench-dummy
if [[ $USE_CACHE == 1 ]]; then
  cp "$WORK/policy.yaml" "$WORK/policy-cache.yaml"
  printf 'cache: {enabled: true}\n' >>"$WORK/policy-cache.yaml"
  start_gateway cache "$WORK/policy-cache.yaml" "$CACHE_PORT"
  CACHE_PID=$START_PID
fi
if [[ $KEY_MODE != none ]]; then
  GW_KEY=$(create_key "$GW_PORT") || die "could not create a virtual key for --key $KEY_MODE"
  if [[ -n $FULL_PID ]]; then
    FULL_KEY=$(create_key "$FULL_PORT") || die "could not create a virtual key for --key $KEY_MODE"
  fi
  if [[ -n $CACHE_PID ]]; then
    CACHE_KEY=$(create_key "$CACHE_PORT") || die "could not create a virtual key for --key $KEY_MODE"
  fi
  log "virtual key ($KEY_MODE) created"
fi

# --- the floor of a Python hop (optional, --floor) -----------------------------------------

FLOOR_PID=""
RAW_PID=""
# start_floor NAME SERVER PORT: bench/floor.py on the gateway's policy (the same upstreams);
# sets START_PID.
start_floor() {
  local name=$1 server=$2 port=$3
  start "$name" "$WORK/$name.log" "$HOLD_PYTHON" "$BENCH_DIR/floor.py" \
    --policy "$WORK/policy.yaml" --port "$port" --server "$server"
  if ! wait_http "http://127.0.0.1:$port/healthz" 30 "$START_PID"; then
    tail -n 20 "$WORK/$name.log" >&2 || true
    die "$name (bench/floor.py --server $server) did not start (log: $WORK/$name.log)"
  fi
  log "$name up on :$port"
}
if [[ $USE_FLOOR == 1 ]]; then
  start_floor floor aiohttp "$FLOOR_PORT"
  FLOOR_PID=$START_PID
  start_floor floor-raw protocol "$RAW_PORT"
  RAW_PID=$START_PID
fi

# --- Portkey (optional, --peers) ----------------------------------------------------------

PORTKEY_STATUS="not requested"
PORTKEY_VERSION=""
PK_PID=""
# Portkey's gateway 1.15.2 with @hono/node-server and hono pinned to the versions its own
# lockfile has: newer ones answer every stream with a 500.
PORTKEY_PACKAGES='"@portkey-ai/gateway": "1.15.2", "@hono/node-server": "1.13.5", "hono": "4.9.7"'
setup_portkey() {
  local entry=$PORTKEY_DIR/node_modules/@portkey-ai/gateway/build/start-server.js
  if [[ ! -f $entry || ! -f $PORTKEY_DIR/.installed ]]; then
    log "Portkey: npm install into $PORTKEY_DIR (a minute)"
    mkdir -p "$PORTKEY_DIR"
    cat >"$PORTKEY_DIR/package.json" <<EOF
{
  "name": "switchyard-bench-portkey",
  "private": true,
  "description": "Portkey's gateway for bench/overhead.sh --peers (written by the script)",
  "dependencies": {$PORTKEY_PACKAGES},
  "overrides": {"@hono/node-server": "1.13.5", "hono": "4.9.7"}
}
EOF
    if ! (cd "$PORTKEY_DIR" && "$NPM" install --no-audit --no-fund --ignore-scripts) \
      >"$WORK/portkey-install.log" 2>&1; then
      tail -n 15 "$WORK/portkey-install.log" >&2
      PORTKEY_STATUS="npm install failed (see $WORK/portkey-install.log)"
      return 1
    fi
    touch "$PORTKEY_DIR/.installed"
  fi
  PORTKEY_VERSION=$("$NODE" -p 'require(process.argv[1]).version' \
    "$PORTKEY_DIR/node_modules/@portkey-ai/gateway/package.json" 2>/dev/null || echo unknown)
  # start-server.js takes --port=N and --headless (no web UI, no log stream) but no host:
  # bench/portkey/loopback.mjs, loaded first, binds its listening socket to 127.0.0.1.
  log "Portkey $PORTKEY_VERSION: node $entry --port=$PK_PORT --headless (bound to 127.0.0.1)"
  start portkey "$WORK/portkey.log" "$NODE" \
    --import "$BENCH_DIR/portkey/loopback.mjs" "$entry" "--port=$PK_PORT" --headless
  PK_PID=$START_PID
  # Any path answers once it listens (GET / is its banner page).
  if ! wait_http "http://127.0.0.1:$PK_PORT/" 30 "$PK_PID"; then
    tail -n 20 "$WORK/portkey.log" >&2 || true
    PORTKEY_STATUS="did not start (see $WORK/portkey.log)"
    stop_group "$PK_PID"
    PK_PID=""
    return 1
  fi
  PORTKEY_STATUS="ok"
  log "Portkey up on :$PK_PORT"
}
if [[ $USE_PEERS == 1 ]]; then
  if ! setup_portkey; then
    log "WARNING: Portkey $PORTKEY_STATUS; continuing without it"
    KEEP=1
  fi
fi

# --- LiteLLM (optional) -------------------------------------------------------------------

LITELLM_STATUS="not requested"
LITELLM_VERSION=""
LL_PID=""
LL_KEY=""
setup_litellm() {
  local bin=$LITELLM_VENV/bin/litellm
  if [[ ! -x $bin ]]; then
    log "LiteLLM: creating a throwaway venv in $LITELLM_VENV and installing '$LITELLM_SPEC' (takes minutes)"
    if ! { "$PYTHON" -m venv "$LITELLM_VENV" &&
      "$LITELLM_VENV/bin/pip" install -q --upgrade pip &&
      "$LITELLM_VENV/bin/pip" install "$LITELLM_SPEC"; } >"$WORK/litellm-install.log" 2>&1; then
      tail -n 15 "$WORK/litellm-install.log" >&2
      LITELLM_STATUS="install failed (pip install '$LITELLM_SPEC'; see $WORK/litellm-install.log)"
      return 1
    fi
  fi
  LITELLM_VERSION=$("$LITELLM_VENV/bin/python" -c \
    'import importlib.metadata as m; print(m.version("litellm"))' 2>/dev/null || echo unknown)
  cat >"$WORK/litellm.yaml" <<EOF
model_list:
  - model_name: canned
    litellm_params:
      model: openai/canned
      api_base: http://127.0.0.1:$JSON_PORT/v1
      api_key: sk-bench-dummy
  - model_name: canned-stream
    litellm_params:
      model: openai/canned-stream
      api_base: http://127.0.0.1:$SSE_PORT/v1
      api_key: sk-bench-dummy
  - model_name: canned-slow
    litellm_params:
      model: openai/canned-slow
      api_base: http://127.0.0.1:$SSE_PORT/slow/v1
      api_key: sk-bench-dummy
litellm_settings:
  drop_params: true
  request_timeout: 30
  json_logs: true
general_settings:
  disable_spend_logs: true
EOF
  log "LiteLLM $LITELLM_VERSION: litellm --config $WORK/litellm.yaml --port $LL_PORT --num_workers 1"
  # LiteLLM refuses to start without a master key (and then checks it on every request,
  # as in any real deployment); no database, so the check is an in-memory compare.
  # No network fetch of the model cost map, no telemetry, errors only in the log.
  LL_KEY=sk-bench-$("$PYTHON" -c 'import secrets; print(secrets.token_hex(24))')
  start litellm "$WORK/litellm.log" env -u DATABASE_URL -u REDIS_URL LITELLM_MASTER_KEY="$LL_KEY" \
    LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY_DISABLED=true LITELLM_LOG=ERROR \
    "$bin" --config "$WORK/litellm.yaml" --host 127.0.0.1 --port "$LL_PORT" --num_workers 1
  LL_PID=$START_PID
  if ! wait_http "http://127.0.0.1:$LL_PORT/health/liveliness" 180 "$LL_PID"; then
    tail -n 20 "$WORK/litellm.log" >&2 || true
    LITELLM_STATUS="did not start (see $WORK/litellm.log)"
    stop_group "$LL_PID"
    LL_PID=""
    return 1
  fi
  LITELLM_STATUS="ok"
  log "LiteLLM up on :$LL_PORT"
}
if [[ $USE_LITELLM == 1 ]]; then
  if ! setup_litellm; then
    log "WARNING: LiteLLM $LITELLM_STATUS; continuing without it"
    KEEP=1
  fi
fi

# --- targets ------------------------------------------------------------------------------

TARGETS=(direct gateway)
[[ -n $FULL_PID ]] && TARGETS+=(full)
[[ -n $FLOOR_PID ]] && TARGETS+=(floor floor-raw)
[[ -n $PK_PID ]] && TARGETS+=(portkey)
[[ -n $LL_PID ]] && TARGETS+=(litellm)

# target_url TARGET MODE; target_model TARGET MODE; target_pgid TARGET
# Mode `hold` is the paced stream of --hold (nginx's /slow/v1).
target_url() {
  case "$1:$2" in
    direct:nonstream | direct:cache-*) echo "http://127.0.0.1:$JSON_PORT/v1/chat/completions" ;;
    direct:stream) echo "http://127.0.0.1:$SSE_PORT/v1/chat/completions" ;;
    direct:hold) echo "http://127.0.0.1:$SSE_PORT/slow/v1/chat/completions" ;;
    gateway:responses | gateway:resp-stream) echo "http://127.0.0.1:$GW_PORT/v1/responses" ;;
    gateway:*) echo "http://127.0.0.1:$GW_PORT/v1/chat/completions" ;;
    full:responses | full:resp-stream) echo "http://127.0.0.1:$FULL_PORT/v1/responses" ;;
    full:*) echo "http://127.0.0.1:$FULL_PORT/v1/chat/completions" ;;
    cache:*) echo "http://127.0.0.1:$CACHE_PORT/v1/chat/completions" ;;
    portkey:*) echo "http://127.0.0.1:$PK_PORT/v1/chat/completions" ;;
    floor:*) echo "http://127.0.0.1:$FLOOR_PORT/v1/chat/completions" ;;
    floor-raw:*) echo "http://127.0.0.1:$RAW_PORT/v1/chat/completions" ;;
    litellm:*) echo "http://127.0.0.1:$LL_PORT/v1/chat/completions" ;;
  esac
}
target_model() {
  case $2 in
    stream | resp-stream) echo canned-stream ;;
    hold) echo canned-slow ;;
    *) echo canned ;;
  esac
}
# mode_targets MODE: the targets a mode runs on (the Responses modes only on Switchyard; the
# cache modes on direct, the gateway with the cache off and the one with it on).
mode_targets() {
  if is_cache_mode "$1"; then
    echo direct gateway cache
  elif [[ $1 == responses || $1 == resp-stream ]]; then
    echo gateway
    [[ -z $FULL_PID ]] || echo full
  else
    echo "${TARGETS[@]}"
  fi
}
target_pgid() {
  case "$1" in
    direct) echo "$NGINX_PID" ;;
    gateway) echo "$GW_PID" ;;
    full) echo "$FULL_PID" ;;
    cache) echo "$CACHE_PID" ;;
    portkey) echo "$PK_PID" ;;
    floor) echo "$FLOOR_PID" ;;
    floor-raw) echo "$RAW_PID" ;;
    litellm) echo "$LL_PID" ;;
  esac
}
target_key() {
  case "$1" in
    litellm) echo "$LL_KEY" ;;
    gateway) echo "$GW_KEY" ;;
    full) echo "$FULL_KEY" ;;
    cache) echo "$CACHE_KEY" ;;
    *) echo sk-bench-dummy ;;
  esac
}
# target_headers TARGET MODE: extra request headers, '|'-separated (wrk/common.lua's
# BENCH_HEADERS). Portkey is told the provider and the upstream per request, as its docs
# show for a self-hosted OpenAI-compatible server: x-portkey-custom-host replaces the
# provider's base URL, /v1 included (it appends /chat/completions).
target_headers() {
  [[ $1 == portkey ]] || return 0
  local url
  url=$(target_url direct "$2")
  echo "x-portkey-provider: openai|x-portkey-custom-host: ${url%/chat/completions}"
}
mode_script() {
  case "$1" in
    stream) echo "$BENCH_DIR/wrk/chat_stream.lua" ;;
    responses) echo "$BENCH_DIR/wrk/responses.lua" ;;
    resp-stream) echo "$BENCH_DIR/wrk/responses_stream.lua" ;;
    *) echo "$BENCH_DIR/wrk/chat.lua" ;;
  esac
}

# One request per target and mode with curl: status, completeness and size of the answer.
: >"$WORK/sanity.jsonl"
for mode in $MODES; do
  for target in $(mode_targets "$mode"); do
    model=$(target_model "$target" "$mode")
    stream=false
    [[ $mode == stream || $mode == resp-stream ]] && stream=true
    req="{\"model\":\"$model\",\"stream\":$stream,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
    [[ $mode == responses || $mode == resp-stream ]] &&
      req="{\"model\":\"$model\",\"stream\":$stream,\"store\":false,\"input\":\"hi\"}"
    is_cache_mode "$mode" &&
      req="{\"model\":\"$model\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
    out=$WORK/sanity-$target-$mode.out
    extra=()
    IFS='|' read -r -a hdrs <<<"$(target_headers "$target" "$mode")"
    for h in "${hdrs[@]}"; do extra+=(-H "$h"); done
    code=$(curl -sS -o "$out" -D "$out.headers" -w '%{http_code}' --max-time 30 -H 'Content-Type: application/json' \
      -H "Authorization: Bearer $(target_key "$target")" "${extra[@]}" \
      -d "$req" "$(target_url "$target" "$mode")" 2>/dev/null || echo 000)
    bytes=$(wc -c <"$out" 2>/dev/null || echo 0)
    if [[ $mode == resp-stream ]]; then
      events=$(grep -c '^data: ' "$out" || true)
      usage_chunk=$(grep -c '"input_tokens_details"' "$out" || true)
      complete=$(grep -q '^event: response.completed' "$out" && echo true || echo false)
    elif [[ $mode == responses ]]; then
      events=0
      usage_chunk=0
      complete=$(grep -q '"output"' "$out" && echo true || echo false)
    elif [[ $mode == stream ]]; then
      events=$(grep -c '^data: ' "$out" || true)
      usage_chunk=$(grep -c '"choices":\[\],' "$out" || true)
      complete=$(grep -q '^data: \[DONE\]' "$out" && echo true || echo false)
    else
      events=0
      usage_chunk=0
      complete=$(grep -q '"choices"' "$out" && echo true || echo false)
    fi
    # Switchyard says where it routed (the full gateway: through the router).
    route=$(tr -d '\r' <"$out.headers" 2>/dev/null |
      awk -F': ' 'tolower($1) == "x-switchyard-route" { print "; route: " $2 } tolower($1) == "x-switchyard-cache" { print "; cache: " $2 }' | tr -d '\n')
    log "check $target $mode: HTTP $code, $bytes bytes, complete=$complete, SSE data lines=$events, usage chunks=$usage_chunk$route"
    printf '{"target":"%s","mode":"%s","status":%d,"bytes":%d,"complete":%s,"sse_events":%d,"usage_chunks":%d}\n' \
      "$target" "$mode" "$code" "$bytes" "$complete" "$events" "$usage_chunk" >>"$WORK/sanity.jsonl"
    if [[ $code != 200 || $complete != true ]]; then
      log "ERROR: $target $mode did not answer a complete 200; see $out"
      FAILED=1
    fi
  done
done

# --- runs ---------------------------------------------------------------------------------

# wrk threads: one by default at every concurrency. On 2 cores a second wrk thread only
# competes with nginx and the gateway; one thread drives 64 connections at > 80k req/s
# against nginx. See README ("wrk threads"). Never more threads than connections.
wrk_threads() { if [[ $1 -lt $WRK_THREADS ]]; then echo "$1"; else echo "$WRK_THREADS"; fi; }

# run_wrk TARGET MODE CONC SECONDS LABEL: prints the BENCH_RESULT JSON (or nothing).
run_wrk() {
  local target=$1 mode=$2 conc=$3 secs=$4 label=$5 wlog timeout=10s
  wlog=$WORK/wrk-$label.log
  # LiteLLM at c=256 queues for longer than 10 s; a timeout there would count as an error.
  [[ $target == litellm ]] && timeout=60s
  # In the background and waited for, so that a signal reaches the trap at once.
  # The cache modes: deterministic requests (temperature 0); cache-miss makes each one unique.
  local temperature=0.2 unique=0
  is_cache_mode "$mode" && temperature=0
  [[ $mode == cache-miss ]] && unique=1
  BENCH_MODEL=$(target_model "$target" "$mode") BENCH_LABEL=$label BENCH_API_KEY=$(target_key "$target") \
    BENCH_HEADERS=$(target_headers "$target" "$mode") BENCH_TEMPERATURE=$temperature BENCH_UNIQUE=$unique \
    "$WRK" -t"$(wrk_threads "$conc")" -c"$conc" -d"${secs}s" --timeout "$timeout" \
    -s "$(mode_script "$mode")" "$(target_url "$target" "$mode")" >"$wlog" 2>&1 &
  WRK_PID=$!
  wait "$WRK_PID" || true
  WRK_PID=""
  sed -n 's/^BENCH_RESULT //p' "$wlog" | tail -n 1
}

# CHILD_MS: CPU ms used so far by this shell's finished children (wrk, mostly), from `times`.
# (`times` must run in this shell, not in a pipe's subshell, to see those children.)
children_cpu_ms() {
  times >"$WORK/times"
  CHILD_MS=$(awk 'NR == 2 {
    t = 0
    for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60000 + substr(a[2], 1, length(a[2]) - 1) * 1000 }
    printf "%d\n", t
  }' "$WORK/times")
}

if ((WARMUP_S > 0)); then
  for mode in $MODES; do
    for target in $(mode_targets "$mode"); do
      log "warm-up: $target $mode, ${WARMUP_S}s at c=16"
      run_wrk "$target" "$mode" 16 "$WARMUP_S" "warmup-$target-$mode" >/dev/null
    done
  done
fi

# cache-hit measures hits: the first request of the warm-up stores the entry every later
# one is answered from. Without a warm-up, one second of the same load does it.
if [[ $WARMUP_S == 0 && " $MODES " == *" cache-hit "* ]]; then
  log "warm-up: cache cache-hit, 1s at c=1 (stores the entry the hits are answered from)"
  run_wrk cache cache-hit 1 1 warmup-cache-cache-hit >/dev/null
fi

RUNS=$WORK/runs.jsonl
: >"$RUNS"

# --profile: py-spy (100 Hz) on every gateway worker during each gateway run (raw stacks, then
# bench/profile_summary.py). Sampling costs CPU on this small machine, so the numbers of
# a profiled run are not the ones to quote.
PROFILE_DIR=${OUT%.json}-profile
start_profilers() {
  local label=$1 pgid=$2 pids pid secs=${3:-$((DURATION_S > 2 ? DURATION_S - 1 : 1))}
  mkdir -p "$PROFILE_DIR"
  pids=$(ps -e -o pid=,pgid=,comm= | awk -v g="$pgid" '$2 == g && $3 != "redis-server" { print $1 }')
  # With several workers, leave out the supervisor (it only sleeps).
  [[ $(wc -w <<<"$pids") -gt 1 ]] && pids=$(tr ' ' '\n' <<<"$pids" | grep -vx "$pgid")
  PROFILERS=()
  for pid in $pids; do
    "$PY_SPY" record --pid "$pid" --rate 100 --duration "$secs" --format raw \
      --output "$PROFILE_DIR/$label-$pid.txt" >"$WORK/py-spy-$label-$pid.log" 2>&1 &
    PROFILERS+=("$!")
  done
}
wait_profilers() {
  local p
  for p in "${PROFILERS[@]}"; do wait "$p" || log "WARNING: py-spy failed (see $WORK/py-spy-*.log)"; done
  PROFILERS=()
}

# measure TARGET MODE CONC ROUND: one wrk run, with the CPU the processes used meanwhile,
# appended to $RUNS as one JSON line.
measure() {
  local target=$1 mode=$2 conc=$3 round=$4 label pgid result busy
  local app0 other0 nginx0 mt0 idle0 wrk_ms0 app1 other1 nginx1 mt1 idle1 wrk_ms1
  label=$target-$mode-c$conc-r$round
  pgid=$(target_pgid "$target")
  read -r app0 other0 <<<"$(group_cpu "$pgid")"
  read -r nginx0 _ <<<"$(group_cpu "$NGINX_PID")"
  read -r mt0 idle0 <<<"$(machine_ticks)"
  [[ $PROFILE == 1 && $target =~ ^(gateway|full|cache)$ ]] && start_profilers "$label" "$pgid"
  children_cpu_ms
  wrk_ms0=$CHILD_MS
  run_wrk "$target" "$mode" "$conc" "$DURATION_S" "$label" >"$WORK/result.json"
  children_cpu_ms
  wrk_ms1=$CHILD_MS
  [[ $PROFILE == 1 && $target =~ ^(gateway|full|cache)$ ]] && wait_profilers
  read -r app1 other1 <<<"$(group_cpu "$pgid")"
  read -r nginx1 _ <<<"$(group_cpu "$NGINX_PID")"
  read -r mt1 idle1 <<<"$(machine_ticks)"
  result=$(<"$WORK/result.json")
  if [[ -z $result ]]; then
    log "ERROR: wrk gave no result for $label (see $WORK/wrk-$label.log)"
    tail -n 5 "$WORK/wrk-$label.log" >&2 || true
    FAILED=1
    result=null
  fi
  busy=$(((mt1 - mt0) - (idle1 - idle0)))
  printf '{"target":"%s","mode":"%s","concurrency":%d,"round":%d,"wrk_threads":%d,"cpu_ticks":{"app":%d,"redis":%d,"nginx":%d,"machine_busy":%d,"machine_total":%d},"wrk_cpu_ms":%d,"wrk":%s}\n' \
    "$target" "$mode" "$conc" "$round" "$(wrk_threads "$conc")" $((app1 - app0)) $((other1 - other0)) \
    $((nginx1 - nginx0)) "$busy" $((mt1 - mt0)) $((wrk_ms1 - wrk_ms0)) "$result" >>"$RUNS"
}

# Targets back to back at each mode and concurrency; with --repeat N, N such rounds,
# interleaved so that a slow minute of the machine hits every target alike; the report
# shows medians over the rounds.
total_runs=0
for mode in $MODES; do
  total_runs=$((total_runs + $(wc -w <<<"$(mode_targets "$mode")") * $(wc -w <<<"$(mode_concurrency "$mode")") * REPEAT))
done
log "measuring: $total_runs runs of ${DURATION_S}s (wrk -t$WRK_THREADS, --timeout 10s)"
run_no=0
for mode in $MODES; do
  for conc in $(mode_concurrency "$mode"); do
    for ((round = 1; round <= REPEAT; round++)); do
      for target in $(mode_targets "$mode"); do
        run_no=$((run_no + 1))
        printf '  [%d/%d]' "$run_no" "$total_runs"
        measure "$target" "$mode" "$conc" "$round"
        "$PYTHON" "$BENCH_DIR/report.py" line "$RUNS" "$CLK_TCK"
      done
    done
  done
done

# --- held streams (--hold N) --------------------------------------------------------------

# N paced streams (nginx's /slow/v1: ~5 s each) opened over --hold-ramp seconds through each
# target in turn, every round: all of them are open at once after the ramp. bench/hold.py
# reports completions, time to first byte and the target's peak RSS and CPU.
HOLD=$WORK/hold.jsonl
: >"$HOLD"
if ((HOLD_STREAMS > 0)); then
  log "holding $HOLD_STREAMS streams open at once (opened over ${HOLD_RAMP_S}s, ~5 s each) per target and round"
  for ((round = 1; round <= REPEAT; round++)); do
    for target in "${TARGETS[@]}"; do
      label=hold-$target-r$round
      hold_args=(--url "$(target_url "$target" hold)" --model "$(target_model "$target" hold)"
        --streams "$HOLD_STREAMS" --ramp-s "$HOLD_RAMP_S" --api-key "$(target_key "$target")"
        --pgid "$(target_pgid "$target")" --label "$label")
      IFS='|' read -r -a hdrs <<<"$(target_headers "$target" hold)"
      for h in "${hdrs[@]}"; do hold_args+=(--header "$h"); done
      "$HOLD_PYTHON" "$BENCH_DIR/hold.py" "${hold_args[@]}" >"$WORK/$label.log" 2>&1 &
      WRK_PID=$!
      # The opening burst (the ramp and a second more) is what --profile samples here.
      [[ $PROFILE == 1 && $target =~ ^(gateway|full)$ ]] &&
        start_profilers "$label" "$(target_pgid "$target")" "$(printf '%.0f' "$HOLD_RAMP_S")"
      wait "$WRK_PID" || true
      WRK_PID=""
      [[ $PROFILE == 1 && $target =~ ^(gateway|full)$ ]] && wait_profilers
      result=$(sed -n 's/^HOLD_RESULT //p' "$WORK/$label.log" | tail -n 1)
      if [[ -z $result ]]; then
        log "ERROR: no result from bench/hold.py for $label (see $WORK/$label.log)"
        tail -n 5 "$WORK/$label.log" >&2 || true
        FAILED=1
        result=null
      fi
      printf '{"target":"%s","round":%d,"hold":%s}\n' "$target" "$round" "$result" >>"$HOLD"
      "$PYTHON" "$BENCH_DIR/report.py" hold-line "$HOLD"
    done
  done
fi

# --- memory, then the report --------------------------------------------------------------

read -r gw_rss gw_redis_rss gw_procs <<<"$(group_rss "$GW_PID")"
ll_rss=0
ll_procs=0
if [[ -n $LL_PID ]]; then read -r ll_rss _ ll_procs <<<"$(group_rss "$LL_PID")"; fi
full_rss=0
full_procs=0
if [[ -n $FULL_PID ]]; then read -r full_rss _ full_procs <<<"$(group_rss "$FULL_PID")"; fi
cache_rss=0
cache_procs=0
if [[ -n $CACHE_PID ]]; then read -r cache_rss _ cache_procs <<<"$(group_rss "$CACHE_PID")"; fi
pk_rss=0
pk_procs=0
if [[ -n $PK_PID ]]; then read -r pk_rss _ pk_procs <<<"$(group_rss "$PK_PID")"; fi

git_rev=$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo none)
# Read-only: does the working tree differ from that commit in the gateway's code?
git_dirty=false
git -C "$REPO_ROOT" diff-index --quiet HEAD -- gateway local_backend 2>/dev/null || git_dirty=true
cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || echo unknown)
cat >"$WORK/meta.json" <<EOF
{
  "timestamp_utc": "$STAMP",
  "host": {"nproc": $(nproc), "cpu_model": "$cpu_model", "kernel": "$(uname -r)", "mem_total_kb": $(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)},
  "settings": {"key": "$KEY_MODE", "workers": $WORKERS, "wrk_threads": $WRK_THREADS, "repeat": $REPEAT, "duration_s": $DURATION_S, "warmup_s": $WARMUP_S, "concurrency": [${CONCURRENCY// /, }], "stream_concurrency": [${STREAM_CONCURRENCY// /, }], "full": $USE_FULL, "full_minus": "$FULL_MINUS", "cache": $USE_CACHE, "peers": $USE_PEERS, "floor": $USE_FLOOR, "hold_streams": $HOLD_STREAMS, "hold_ramp_s": $HOLD_RAMP_S, "modes": ["${MODES// /\", \"}"], "clk_tck": $CLK_TCK},
  "versions": {"nginx": "$("$NGINX" -v 2>&1 | sed 's/.*nginx\///')", "wrk": "$("$WRK" -v 2>&1 | head -n 1 | awk '{ print $2 }')", "switchyard_git": "$git_rev", "switchyard_git_dirty": $git_dirty, "litellm": "$LITELLM_VERSION", "portkey": "$PORTKEY_VERSION", "node": "$([[ -n $NODE ]] && "$NODE" --version 2>/dev/null)"},
  "machine_busy_before_pct": $BUSY_BEFORE,
  "load_average_before": "$LOAD_BEFORE",
  "litellm_status": "$LITELLM_STATUS",
  "portkey_status": "$PORTKEY_STATUS",
  "gateway_warning": "${GW_HEALTHZ_WARNING:-}",
  "rss_after_kb": {"gateway": $gw_rss, "gateway_processes": $gw_procs, "gateway_embedded_redis": $gw_redis_rss, "litellm": $ll_rss, "litellm_processes": $ll_procs, "full": $full_rss, "full_processes": $full_procs, "cache": $cache_rss, "cache_processes": $cache_procs, "portkey": $pk_rss, "portkey_processes": $pk_procs}
}
EOF

report_args=(report "$RUNS" "$WORK/meta.json" "$WORK/sanity.jsonl" --hold "$HOLD" --out "$OUT")
[[ -n $BASELINE ]] && report_args+=(--baseline "$BASELINE")
[[ $STRICT == 1 ]] && report_args+=(--strict)
rc=0
"$PYTHON" "$BENCH_DIR/report.py" "${report_args[@]}" || rc=$?
if [[ $PROFILE == 1 ]] && compgen -G "$PROFILE_DIR/gateway-*-c64-r1-*.txt" >/dev/null; then
  echo
  log "profiles (py-spy raw stacks) in $PROFILE_DIR; at c=64:"
  "$PYTHON" "$BENCH_DIR/profile_summary.py" --top 25 "$PROFILE_DIR"/gateway-*-c64-r1-*.txt |
    tee "$PROFILE_DIR/summary-c64.txt"
fi
log "results: $OUT"
if [[ $FAILED != 0 && $rc == 0 ]]; then
  log "some steps failed (see the messages above)"
  rc=1
fi
exit "$rc"
