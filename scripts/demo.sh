#!/usr/bin/env bash
# The local demo, from a fresh clone: installs the build dependencies, builds the launcher and
# the chat client, starts a cluster (router + 1 prefill node + 1 decode node) on this machine,
# says what model it serves, sends a two-turn streamed chat, prints each answer with its timings,
# prefix-cache reuse, speculative drafts accepted and where the time went, and stops the cluster.
#
#   scripts/demo.sh
#   DEEPINFER_DEMO_MODEL=/path/to/hf_model scripts/demo.sh
#   DEEPINFER_DEMO_PROMPT="Write a haiku about caches" DEEPINFER_DEMO_MAX_TOKENS=64 scripts/demo.sh
#
# Model: $DEEPINFER_DEMO_MODEL, else models/demo if present, else the random-weight test model
# engine/testdata/models/llama (its answers are gibberish: it only shows the data path).
# Speculative decoding: DEEPINFER_DEMO_SPECULATIVE = draft_model (the default with models/demo,
# drafting with models/demo-draft), ngram (the default otherwise) or off.
# Other knobs: DEEPINFER_DEMO_SYSTEM, DEEPINFER_DEMO_FOLLOW_UP (the second turn; empty: one turn),
# DEEPINFER_DEMO_THREADS (per worker), DEEPINFER_DEMO_ROUTER_LISTEN (default 127.0.0.1:0, a free
# port), DEEPINFER_DEMO_STARTUP_SECONDS (default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

bash scripts/setup.sh

echo "demo: building //deploy/local:launcher //tools:chat (optimised; minutes on a fresh clone)"
# Debian's Bazel sandbox prints a debug trace for some actions: keep the build output readable.
bazel build --config=opt //deploy/local:launcher //tools:chat 2>&1 | { grep -v 'linux-sandbox' || true; }
BIN=$(bazel info --config=opt bazel-bin 2>/dev/null)
LAUNCHER=$BIN/deploy/local/launcher
CHAT=$BIN/tools/chat

if [ -n "${DEEPINFER_DEMO_MODEL:-}" ]; then
  MODEL=$DEEPINFER_DEMO_MODEL
elif [ -d models/demo ]; then
  MODEL=$ROOT/models/demo
else
  MODEL=$ROOT/engine/testdata/models/llama
  echo "demo: no trained model (set DEEPINFER_DEMO_MODEL or put one in models/demo): using the"
  echo "demo: random-weight test model $MODEL -- the answer text is gibberish; the"
  echo "demo: point is the path it takes (router -> prefill -> KV over UCX -> decode -> you)."
fi
[ -f "$MODEL/config.json" ] || { echo "demo: $MODEL has no config.json" >&2; exit 1; }

# What the model is, said before anything it writes.
if [ "$(cd "$MODEL" && pwd)" = "$ROOT/models/demo" ]; then
  echo "demo: the model is models/demo, a toy: an 11M-parameter Qwen2-style model trained from"
  echo "demo: scratch on Python source on 2 CPU cores (tools/train; model card models/README.md)."
  echo "demo: It writes Python-shaped text, not correct answers; what the demo shows is the path a"
  echo "demo: request takes and what the cluster measures on the way."
else
  echo "demo: the model is $MODEL ($(grep -o '"model_type": *"[^"]*"' "$MODEL/config.json" | head -n1))"
fi
echo "demo: to serve a real checkpoint (a Hugging Face directory of a supported architecture,"
echo "demo: docs/models.md): DEEPINFER_DEMO_MODEL=/path/to/model scripts/demo.sh, which passes it"
echo "demo: as the launcher's --model (bazel run -c opt //deploy/local:launcher -- --model DIR)."

# Speculative decoding: every worker of a model gets the same flags (the router refuses a worker
# whose speculative configuration differs from the others').
SPEC=${DEEPINFER_DEMO_SPECULATIVE:-}
if [ -z "$SPEC" ]; then
  if [ "$MODEL" = "$ROOT/models/demo" ] && [ -d "$ROOT/models/demo-draft" ]; then
    SPEC=draft_model
  else
    SPEC=ngram
  fi
fi
case "$SPEC" in
  off) SPEC_FLAGS="" ;;
  ngram) SPEC_FLAGS="--speculative=ngram" ;;
  draft_model) SPEC_FLAGS="--speculative=draft_model,--draft_model=$ROOT/models/demo-draft" ;;
  *) echo "demo: DEEPINFER_DEMO_SPECULATIVE=$SPEC: expected draft_model, ngram or off" >&2; exit 1 ;;
esac
echo "demo: speculative decoding: $SPEC${SPEC_FLAGS:+ (worker flags ${SPEC_FLAGS//,/ })}"
SPEC_ARGS=()
[ -z "$SPEC_FLAGS" ] || SPEC_ARGS=(--prefill_flags="$SPEC_FLAGS" --decode_flags="$SPEC_FLAGS")

WORK=$(mktemp -d "${TMPDIR:-/tmp}/deepinfer-demo-XXXXXX")
READY=$WORK/ready
OUT=$WORK/launcher.out
LAUNCHER_PID=""

stop_launcher() {
  [ -n "$LAUNCHER_PID" ] || return 0
  if kill -0 "$LAUNCHER_PID" 2>/dev/null; then
    kill -INT "$LAUNCHER_PID" 2>/dev/null || true
    # The launcher drains the workers, then the router; give it time, then force.
    for _ in $(seq 1 400); do
      kill -0 "$LAUNCHER_PID" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$LAUNCHER_PID" 2>/dev/null; then
      echo "demo: launcher did not stop within 40s; killing it" >&2
      kill -KILL "$LAUNCHER_PID" 2>/dev/null || true  # Its children die with it (PDEATHSIG).
    fi
  fi
  local rc=0
  wait "$LAUNCHER_PID" 2>/dev/null || rc=$?
  LAUNCHER_PID=""
  return $rc
}
cleanup() {
  local rc=$?
  stop_launcher || true
  if [ $rc -ne 0 ]; then
    echo "demo: failed (exit $rc); launcher output and logs kept in $WORK" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "demo: starting the cluster (model $MODEL); logs in $WORK/logs"
"$LAUNCHER" --model "$MODEL" --prefill 1 --decode 1 \
  ${DEEPINFER_DEMO_THREADS:+--threads "$DEEPINFER_DEMO_THREADS"} \
  --router_listen "${DEEPINFER_DEMO_ROUTER_LISTEN:-127.0.0.1:0}" \
  "${SPEC_ARGS[@]}" \
  --log_dir "$WORK/logs" --ready_file "$READY" \
  --startup_timeout "${DEEPINFER_DEMO_STARTUP_SECONDS:-300}s" >"$OUT" 2>&1 &
LAUNCHER_PID=$!

deadline=$((SECONDS + ${DEEPINFER_DEMO_STARTUP_SECONDS:-300} + 10))
until [ -s "$READY" ]; do
  if ! kill -0 "$LAUNCHER_PID" 2>/dev/null; then
    cat "$OUT" >&2
    echo "demo: the launcher exited before the cluster was ready" >&2
    exit 1
  fi
  if [ $SECONDS -ge $deadline ]; then
    cat "$OUT" >&2
    echo "demo: the cluster was not ready in time" >&2
    exit 1
  fi
  sleep 0.2
done
ROUTER=$(head -n1 "$READY")
cat "$OUT"

SYSTEM=${DEEPINFER_DEMO_SYSTEM-"You are a careful Python programmer. Answer with code only, in the style of the standard library, with docstrings and type hints."}
PROMPT=${DEEPINFER_DEMO_PROMPT:-"Write a Python class for a least-recently-used cache."}
FOLLOW_UP=${DEEPINFER_DEMO_FOLLOW_UP-"Add a method that removes one entry."}
echo
[ -z "$SYSTEM" ] || echo "demo: system> $SYSTEM"
echo "demo: user> $PROMPT"
echo -n "demo: assistant> "
# Two turns: the second resends the first turn and its answer, as a chat client does, so its
# "cached" tokens are the prefix cache at work (whole KV blocks of the history already computed).
SYSTEM_ARGS=()
[ -z "$SYSTEM" ] || SYSTEM_ARGS=(--system "$SYSTEM")
"$CHAT" --router "$ROUTER" "${SYSTEM_ARGS[@]}" --message "$PROMPT" \
  --follow_up "$FOLLOW_UP" --max_tokens "${DEEPINFER_DEMO_MAX_TOKENS:-48}" --temperature 0 --stream
echo
echo "demo: each '--' block: the request's tokens and client-side latency; the prefix cache's"
echo "demo: reuse (prompt KV not computed again: the second turn repeats the first); speculative"
echo "demo: drafts verified and accepted (outputs are the same as without them); and the cluster's"
echo "demo: own account of the time: queued, prefill on the prefill node with the KV transfer to"
echo "demo: the decode node, routing up to the first token, then decoding."

echo "demo: stopping the cluster"
rc=0
stop_launcher || rc=$?
tail -n 2 "$OUT"
if [ $rc -ne 0 ]; then
  echo "demo: the cluster did not stop cleanly (launcher exit $rc); logs in $WORK/logs" >&2
  exit $rc
fi
echo "demo: done; process logs kept in $WORK/logs"
