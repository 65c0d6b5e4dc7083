#!/usr/bin/env bash
# The launcher end to end: start a 1 prefill + 1 decode cluster on the test model, wait for the
# ready file, send one chat and a two-turn chat through //tools:chat (the second turn reuses the
# first's prefix), check the Ctrl-C path stops everything cleanly
# (exit 0, no process left), and that a crashed worker is reported with exit status 1.
set -euo pipefail

LAUNCHER=deploy/local/launcher
CHAT=tools/chat
MODEL=engine/testdata/models/llama
WORK=${TEST_TMPDIR:-$(mktemp -d)}
pid=""
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true' EXIT

fail() { echo "FAIL: $*" >&2; cat "$WORK"/out.* >&2 || true; exit 1; }

start_cluster() {  # $1: run name
  rm -f "$WORK/ready.$1"
  "$LAUNCHER" --model "$MODEL" --prefill 1 --decode 1 --kv_blocks 64 --threads 1 \
    --router_listen 127.0.0.1:0 --http_listen 127.0.0.1:0 --log_dir "$WORK/logs.$1" --ready_file "$WORK/ready.$1" \
    --startup_timeout 60s --stop_timeout 20s >"$WORK/out.$1" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    [ -s "$WORK/ready.$1" ] && return 0
    kill -0 "$pid" 2>/dev/null || fail "launcher exited before ready"
    sleep 0.1
  done
  fail "not ready in 60s"
}

# 1. Serve one request, then SIGINT: clean stop.
start_cluster clean
router=$(head -n1 "$WORK/ready.clean")
grep -q "router endpoint: $router" "$WORK/out.clean" || fail "no endpoint line"
grep -Eq '^prefill +prefill-0 +127\.0\.0\.1:[0-9]+ +pid [0-9]+' "$WORK/out.clean" || fail "no prefill line"
grep -Eq '^decode +decode-0 ' "$WORK/out.clean" || fail "no decode line"
http_url=$(sed -n 's/^HTTP API: //p' "$WORK/out.clean")
[[ "$http_url" =~ ^http://127\.0\.0\.1:[0-9]+/v1$ ]] || fail "no HTTP API line: '$http_url'"
curl -sS --max-time 10 "$http_url/models" | grep -q '"id":"llama"' || fail "GET $http_url/models"
"$CHAT" --router "$router" --message "Hello" --max_tokens 8 >"$WORK/chat.out" 2>&1 ||
  fail "chat failed: $(cat "$WORK/chat.out")"
grep -q "completion 8 tokens" "$WORK/chat.out" || grep -q "finish STOP" "$WORK/chat.out" ||
  fail "unexpected chat summary: $(cat "$WORK/chat.out")"
# The demo's two turns (scripts/demo.sh): the second resends the first's history, whose whole
# KV blocks (a 16-token block size) come from the prefix cache.
"$CHAT" --router "$router" --system "$(printf 'word %.0s' $(seq 1 40))" --message "Hello" \
  --follow_up "Again" --max_tokens 4 >"$WORK/chat2.out" 2>&1 ||
  fail "two-turn chat failed: $(cat "$WORK/chat2.out")"
[ "$(grep -c '^-- prompt ' "$WORK/chat2.out")" -eq 2 ] ||
  fail "want two summaries: $(cat "$WORK/chat2.out")"
sed -n '/^user> Again/,$p' "$WORK/chat2.out" | grep -Eq '^-- prefix cache: [1-9][0-9]* of ' ||
  fail "the second turn reused no prefix: $(cat "$WORK/chat2.out")"
grep -q '^-- where the time went (cluster): queue ' "$WORK/chat2.out" ||
  fail "no timing line: $(cat "$WORK/chat2.out")"
pids=$(grep -Eo 'pid [0-9]+' "$WORK/out.clean" | awk '{print $2}')
kill -INT "$pid"
rc=0; wait "$pid" || rc=$?
pid=""
[ "$rc" -eq 0 ] || fail "launcher exit $rc after SIGINT"
grep -q "all processes exited cleanly" "$WORK/out.clean" || fail "no clean-stop line"
for p in $pids; do
  ! kill -0 "$p" 2>/dev/null || fail "process $p outlived the launcher"
done

# 2. A worker crashes: the launcher says so, stops the rest, exits 1.
start_cluster crash
decode_pid=$(grep -E '^decode ' "$WORK/out.crash" | grep -Eo 'pid [0-9]+' | awk '{print $2}')
kill -KILL "$decode_pid"
rc=0; wait "$pid" || rc=$?
pid=""
[ "$rc" -eq 1 ] || fail "launcher exit $rc after a worker crash, want 1"
grep -q "decode-0 (pid $decode_pid) exited unexpectedly: killed by signal 9" "$WORK/out.crash" ||
  fail "crash not reported"
echo PASS
