#!/usr/bin/env bash
# Goodput comparison (issue 60): the same mixed workload (long-prompt coding sessions among short
# chat sessions, Poisson arrivals, seeded) against three local clusters of N = 2 worker nodes,
# all started first, then, at each rate, every cluster in turn (order rotated per rate):
#   colocated      2 decode nodes that prefill their own prompts (launcher --colocated, no
#                  prefill node);
#   disaggregated  1 prefill node + 1 decode node;
#   conditional    1 prefill node + 1 decode node that can prefill: prompts with at most
#                  GOODPUT_LOCAL_TOKENS uncached tokens on it (short chat turns, later coding
#                  turns whose history it holds) prefill there (router --colocated_prefill_tokens),
#                  and so do longer ones when the measured KV transfer would stay exposed for more
#                  than GOODPUT_TRANSFER_FRACTION of the prefill compute (router
#                  --max_exposed_transfer_fraction); with GOODPUT_LOAD_AWARE=1 (the default) a
#                  longer prompt also prefills there when its own queue plus the prompt is
#                  predicted to finish sooner than the prefill node's queue plus the prompt plus
#                  the exposed transfer (router --load_aware_local_prefill); with
#                  GOODPUT_SLO_AWARE=1 (the default; it then decides instead of the load-aware
#                  rule) a longer prompt prefills there when the prefill node's path is predicted
#                  to miss the TTFT SLO (or be slower) and the decode node's predicted TTFT and its
#                  running decodes' measured token gap fit within the bench's TTFT and ITL SLOs
#                  (router --placement_slo_ttft_ms / --placement_slo_itl_ms, given the SLOs below).
# Equal total cores: every worker node runs one forward thread, pinned to a core of its own after
# start-up (taskset -a: all its threads), the colocated cluster's two decode nodes on cores 0 and
# 1, the others' prefill node on 0 and decode node on 1; routers, launchers and the bench client
# are not pinned (they use little CPU and float over both). A machine with fewer than 2 CPUs runs
# unpinned.
# Prints the goodput table (SLOs: TTFT <= GOODPUT_SLO_TTFT_MS and per-request ITL p90 <=
# GOODPUT_SLO_ITL_MS), writes it as JSON and, when matplotlib imports, a plot.
#
#   tools/bench/goodput.sh [MODEL_DIR] [OUT_DIR]       (defaults: models/demo, a new temp dir)
#   GOODPUT_RATES="2,4,6,8"   session arrival rates (per second)
#   GOODPUT_SESSIONS=60       sessions per run (each rate and configuration)
#   GOODPUT_CODING_FRACTION=0.3, GOODPUT_CONTEXT_WORDS=1200, GOODPUT_TURNS=2: the coding sessions
#   GOODPUT_SLO_TTFT_MS=1000, GOODPUT_SLO_ITL_MS=25
#   GOODPUT_LOCAL_TOKENS=256, GOODPUT_TRANSFER_FRACTION=0.05, GOODPUT_LOAD_AWARE=1: the
#   conditional cluster's router (GOODPUT_LOAD_AWARE=0: threshold and transfer cost only)
#   GOODPUT_SLO_AWARE=1: SLO-aware local prefill on the conditional cluster (0: off)
#   GOODPUT_SEED=1
# With models/demo (2048 positions) a coding session's first prompt is ~1800 tokens (~0.4 s of
# prefill on one core), a chat prompt ~100 (median); the SLOs are 2.5x that long prefill and a stall of
# about a 128-token prefill chunk between two tokens.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/demo}
OUT=${2:-$(mktemp -d "${TMPDIR:-/tmp}/goodput-XXXXXX")}
RATES=${GOODPUT_RATES:-2,4,6,8}
SESSIONS=${GOODPUT_SESSIONS:-60}
CODING_FRACTION=${GOODPUT_CODING_FRACTION:-0.3}
CONTEXT_WORDS=${GOODPUT_CONTEXT_WORDS:-1200}
TURNS=${GOODPUT_TURNS:-2}
SLO_TTFT=${GOODPUT_SLO_TTFT_MS:-1000}
SLO_ITL=${GOODPUT_SLO_ITL_MS:-25}
LOCAL_TOKENS=${GOODPUT_LOCAL_TOKENS:-256}
TRANSFER_FRACTION=${GOODPUT_TRANSFER_FRACTION:-0.05}
LOAD_AWARE=${GOODPUT_LOAD_AWARE:-1}
SLO_AWARE=${GOODPUT_SLO_AWARE:-1}
SEED=${GOODPUT_SEED:-1}
mkdir -p "$OUT"
PIN=1
[ "$(nproc)" -ge 2 ] || PIN=0
bazel build --config=opt //deploy/local:launcher //tools/bench 2>&1 | { grep -v linux-sandbox || true; } | tail -1
BIN=$(bazel info --config=opt bazel-bin 2>/dev/null)

NAMES=()
declare -A ROUTER PID
stop_all() {
  for name in "${NAMES[@]}"; do kill -INT "${PID[$name]}" 2>/dev/null || true; done
  wait || true
}
trap stop_all EXIT

pin() {  # launcher pid, node binary name, cores (one per node, in pid order)
  local pids cores=($3) i=0 pid
  pids=$(pgrep -P "$1" -f "$2" | sort -n)
  [ -n "$pids" ] || { echo "no $2 child of launcher $1" >&2; exit 1; }
  for pid in $pids; do
    taskset -a -pc "${cores[$i]}" "$pid" >/dev/null
    i=$((i + 1))
  done
}

start_cluster() {  # name, launcher flags...
  local name=$1 ready=$OUT/$1.ready
  shift
  "$BIN/deploy/local/launcher" --model "$MODEL" --threads 1 --router_listen 127.0.0.1:0 \
    --http_listen "" --log_dir "$OUT/$name" --ready_file "$ready" "$@" >"$OUT/$name.out" 2>&1 &
  PID[$name]=$!
  NAMES+=("$name")
  for _ in $(seq 1 900); do [ -s "$ready" ] && break; sleep 0.2; done
  [ -s "$ready" ] || { echo "$name: cluster did not start; see $OUT/$name.out" >&2; exit 1; }
  ROUTER[$name]=$(cat "$ready")
}

start_cluster colocated --prefill 0 --decode 2 --colocated
start_cluster disaggregated --prefill 1 --decode 1
ROUTER_FLAGS="--max_exposed_transfer_fraction=$TRANSFER_FRACTION,--load_aware_local_prefill=$([ "$LOAD_AWARE" = 1 ] && echo true || echo false)"
[ "$SLO_AWARE" = 1 ] && ROUTER_FLAGS+=",--placement_slo_ttft_ms=$SLO_TTFT,--placement_slo_itl_ms=$SLO_ITL"
start_cluster conditional --prefill 1 --decode 1 --colocated \
  --colocated_prefill_tokens "$LOCAL_TOKENS" --router_flags="$ROUTER_FLAGS"
if [ "$PIN" = 1 ]; then
  pin "${PID[colocated]}" decode_node "0 1"
  for name in disaggregated conditional; do
    pin "${PID[$name]}" prefill_node "0"
    pin "${PID[$name]}" decode_node "1"
  done
fi
echo "started ${#NAMES[@]} clusters (pinned: $PIN); logs in $OUT" >&2

"$BIN/tools/bench/bench" \
  --goodput_targets "colocated=${ROUTER[colocated]},disaggregated=${ROUTER[disaggregated]},conditional=${ROUTER[conditional]}" \
  --goodput_rates "$RATES" --goodput_candidate conditional --goodput_json "$OUT/goodput.json" \
  --records_out "$OUT/records.jsonl" --slo_ttft_ms "$SLO_TTFT" --slo_itl_ms "$SLO_ITL" \
  --workload mixed --mixed_coding_fraction "$CODING_FRACTION" --sessions "$SESSIONS" \
  --coding_context_words "$CONTEXT_WORDS" --coding_turns "$TURNS" --coding_answer_tokens 64 \
  --chat_input_words 60 --chat_output_tokens 64 --max_output_tokens 128 --max_input_words 1200 \
  --warmup_sessions 2 --concurrency 2 --seed "$SEED" | tee "$OUT/goodput.txt"
stop_all
trap - EXIT
if python3 -c "import matplotlib" 2>/dev/null; then
  python3 "$(dirname "$0")/plot.py" --out "$OUT" --goodput "$OUT/goodput.json"
else
  echo "matplotlib not installed: no plot (pip install matplotlib)" >&2
fi
echo "results: $OUT (goodput.txt, goodput.json, records.jsonl)"
