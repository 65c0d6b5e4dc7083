#!/usr/bin/env bash
# Speculative-decoding sweep (issue 12): every decode configuration (no speculation, n-gram with
# fixed k in {1,2,4,8} and adaptive, draft model with fixed k and adaptive) gets its own local
# cluster (1 prefill + 1 decode node, every worker with the same speculative flags), all started
# first, one after another (an adaptive node profiles its cost table at start-up on an otherwise
# idle machine; idle clusters use no CPU). Then, per repeat and concurrency, the multi-turn coding
# workload runs closed-loop against each configuration in turn, in an order shuffled per round,
# so configurations compared with each other run minutes apart, not a whole sweep apart (these
# machines are shared: the same configuration's speed drifts by tens of percent over minutes).
# Prints, each also as its ratio to no speculation in the same round:
#   out tok/s   all requests' tokens over the run's time: the cluster's throughput;
#   dec tok/s   the decode tier's throughput while it has work: tokens after each request's first
#               over the time in which at least one request streams (the bench's "decode token
#               throughput"); the figure the adaptive decode node maximises;
#   str tok/s   one stream's speed, 1000 / the mean TPOT (TPOT = (E2E - TTFT) / (completion
#               tokens - 1) per request), which also rises when fewer requests decode at once
#               because the others wait for prefill;
# and tokens per decode step, draft acceptance, TTFT and ITL p90.
#
#   tools/bench/spec_sweep.sh [MODEL_DIR] [DRAFT_DIR]      (defaults: models/demo, models/demo-draft)
#   SWEEP_CONCURRENCY="1 8 32" SWEEP_SESSIONS=6 SWEEP_METHODS="off ngram draft_model" ...
#   SWEEP_SESSIONS: sessions per run (3 turns each); a concurrency above it runs that many.
#   Use 16 for a verdict: at 8 a run at 1 or 8 concurrent requests decodes for ~2 s (+-10% a run)
#   and at 8 requests spends ~40% of its time below 5 decoding.
#   SWEEP_ANSWER_TOKENS=256: answer length of the coding workload (default 256).
#   SWEEP_REPEATS (default 1): rounds; each round uses new prompts (seed from round and
#   concurrency), the same for every configuration. The table shows medians over rounds: tokens/s,
#   and "x/off", the medians of the per-round ratios to "off", with dec/off's min-max as "range".
#   SWEEP_WARMUP_ROUNDS=3: rounds run first (every concurrency, prompts of their own) and left out
#   of the table: a serving node runs for hours, and an adaptive node's first thousands of steps
#   measure its modes (speculative::DraftModeSelector: every mode compared 3 times in every bucket); their
#   figures are printed apart ("cold rounds"). A round is counted in steps, not minutes: since the
#   CPU backend's AMX paths a round at 8 concurrent requests is ~550 decode steps (~5 s), and one
#   cold round left the n-gram node still trialling a quarter of its steps (0.94 of k = 4, two
#   rounds), four left it trialling 6-12% and ahead of k = 4 in 3 rounds of 3.
#   SWEEP_SELECTOR_WARMUP_ROUNDS=6: before those, rounds that run only the adaptive nodes (every
#   configuration whose flags hold --spec_adaptive; every concurrency, prompts of their own; left
#   out of both tables): a node's selector learns each bucket of decoding sequences from trials of
#   its modes (about 15 a bucket: 5 modes compared 3 times), and a bucket gets only 2-3 trials in
#   one round's run of it (an epoch lasts at least 0.25 s, a c = 8 run's 5-8 bucket ~2 s). With the
#   3 cold rounds alone a draft-model node at 8 concurrent requests still ran the plan, a loser
#   there, for 60-75% of its first measured round's 5-8 steps, and settled on k = 1 in its second
#  . A fixed-length node has nothing to learn. 0: none.
#   SWEEP_PIN=1 (default, on a machine with >= 2 CPUs): every decode node runs on the last CPU
#   from its start (launcher --decode_cpus: its start-up cost profile times that CPU), every other
#   process (launchers, routers, prefill nodes, the bench client) on the others, as
#   prefill and decode nodes run on their own machines in a deployment: a prefill burst then no
#   longer slows the decode node's steps, which made decode speed swing with the prefill timing
#   (per-round ranges of 2-3x at concurrency 32 unpinned). SWEEP_PIN=0: no pinning.
#   SWEEP_TRACE=1: decode nodes log at debug level, one "step-trace" line per engine step
#   (the selector's mode and decoding sequences, shape, drafts verified and accepted, the sampled
#   sequences' output tokens so far, period, forward and drafting time) for offline fits.
#   SWEEP_LOG_LEVEL: the other processes' log level (default info).
#   SWEEP_LAUNCHER_FLAGS: more launcher flags for every cluster (space-separated), e.g.
#   "--colocated --colocated_prefill_tokens=256": conditional disaggregation, where a later turn
#   whose uncached part on the decode node is short (its history's KV is there) prefills there
#   instead of re-prefilling the whole history on the prefill node.
#   SWEEP_ADAPTIVE_K_NGRAM=16, SWEEP_ADAPTIVE_K_DRAFT_MODEL=8: the adaptive nodes' longest draft.
#   SWEEP_ADAPTIVE_FLAGS_NGRAM, SWEEP_ADAPTIVE_FLAGS_DRAFT_MODEL: more flags for those nodes
#   (comma-separated; default none).
#   SWEEP_ADAPTIVE_CONFIG_NGRAM, SWEEP_ADAPTIVE_CONFIG_DRAFT_MODEL: the --spec_config JSON of
#   those nodes (docs/spec-config.md; default '{"select_max_length": 8}' and '{}'). An A/B of a
#   knob in SWEEP_EXTRA names a file: SWEEP_EXTRA="rm0=...,--spec_config=/tmp/rm0.json".
#   SWEEP_EXTRA="NAME=FLAGS ...": more configurations beside the methods', NAME running every
#   worker with FLAGS (comma-separated), e.g. SWEEP_EXTRA="off-overlap=--overlap=on".
#   SWEEP_OFF_EVERY=4: in each round (and concurrency) no speculation runs first, again after
#   every 4 other configurations (in their shuffled order) and last, and every other run is rated
#   against the off runs on either side of it, interpolated by place (results.tsv's `slot`;
#   spec_verdict.py): the machine's speed drifts by tens of percent over minutes, and one off run
#   per round, anywhere in it, put that drift into the other runs' ratios (once:
#   one configuration's three rounds at 0.72, 1.24 and 1.26 of no speculation). Each of a round's
#   off runs goes to a cluster of its own (off, off@2, off@3, ...; "off" in results.tsv), which
#   meets the round's prompts as cold as every other configuration does: run again on one
#   cluster, the later runs found every prompt in its prefix cache (TTFT p90 10 ms against 175 ms,
#   1.4 s at 8 concurrent requests) and decoded unhindered by prefill. Costs a run of off per 4
#   others (11 configurations: 14 runs a round instead of 11). 0: off once per round, shuffled
#   with the others.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/demo}
DRAFT=${2:-models/demo-draft}
CONCURRENCY=${SWEEP_CONCURRENCY:-"1 8 32"}
SESSIONS=${SWEEP_SESSIONS:-6}
METHODS=${SWEEP_METHODS:-"off ngram draft_model"}
KS=${SWEEP_KS:-"1 2 4 8 adaptive"}
THREADS=${SWEEP_THREADS:-1}
REPEATS=${SWEEP_REPEATS:-1}
WARMUP_ROUNDS=${SWEEP_WARMUP_ROUNDS:-3}
SELECTOR_WARMUP_ROUNDS=${SWEEP_SELECTOR_WARMUP_ROUNDS:-6}
ANSWER=${SWEEP_ANSWER_TOKENS:-256}
OFF_EVERY=${SWEEP_OFF_EVERY:-4}
# The adaptive nodes' longest draft (--num_speculative_tokens: the plan's cap, and by default the
# selector's fixed lengths 1, 2, 4, ... up to it). n-gram drafts cost nothing to make, and on the
# coding workload a draft of 8 accepted whole was followed by another accepted whole 94% of the
# time at one decoding sequence, so the adaptive n-gram node's plan may
# verify up to 16 while its fixed lengths stop at 8 (select_max_length: a fixed 16, measured
# beside the plan, took the 5-8 bucket at 8 concurrent requests at 76% of the plan's rate); a
# draft model pays a forward pass per token, and its k = 8 is already well behind k = 4.
ADAPTIVE_K_NGRAM=${SWEEP_ADAPTIVE_K_NGRAM:-16}
ADAPTIVE_K_DRAFT_MODEL=${SWEEP_ADAPTIVE_K_DRAFT_MODEL:-8}
ADAPTIVE_FLAGS_NGRAM=${SWEEP_ADAPTIVE_FLAGS_NGRAM-}
ADAPTIVE_FLAGS_DRAFT_MODEL=${SWEEP_ADAPTIVE_FLAGS_DRAFT_MODEL-}
ADAPTIVE_CONFIG_NGRAM=${SWEEP_ADAPTIVE_CONFIG_NGRAM-'{"select_max_length": 8}'}
ADAPTIVE_CONFIG_DRAFT_MODEL=${SWEEP_ADAPTIVE_CONFIG_DRAFT_MODEL-'{}'}
CPUS=$(nproc)
PIN=${SWEEP_PIN:-1}
[ "$CPUS" -ge 2 ] || PIN=0
DECODE_CPU=$((CPUS - 1))
OTHER_CPUS=0-$((CPUS - 2))
# Prefix that runs a command on the non-decode CPUs when pinning (taskset execs it: same pid).
PINNED=()
DECODE_PIN=()
[ "$PIN" = 1 ] && PINNED=(taskset -c "$OTHER_CPUS") && DECODE_PIN=(--decode_cpus="$DECODE_CPU")
bazel build --config=opt //deploy/local:launcher //tools/bench 2>&1 | { grep -v linux-sandbox || true; } | tail -1
BIN=$(bazel info --config=opt bazel-bin 2>/dev/null)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/spec-sweep-XXXXXX")
RESULTS=$WORK/results.tsv
COLD=$WORK/cold.tsv
HEADER="repeat\tconfig\tconcurrency\tslot\tout_tok_s\tdecode_tok_s\tstream_tok_s\ttokens_per_step\tacceptance\tttft_p90_ms\titl_p90_ms"
echo -e "$HEADER" >"$RESULTS"
echo -e "$HEADER" >"$COLD"

NAMES=()
ADAPTIVE=()
declare -A ROUTER PID
stop_all() {
  for name in "${NAMES[@]}"; do kill -INT "${PID[$name]}" 2>/dev/null || true; done
  wait || true
}
trap stop_all EXIT

start_config() {  # name, flags (comma-separated)
  local name=$1 flags=$2 ready=$WORK/$1.ready
  "${PINNED[@]}" "$BIN/deploy/local/launcher" --model "$MODEL" --prefill 1 --decode 1 --threads "$THREADS" \
    --router_listen 127.0.0.1:0 --http_listen "" --log_dir "$WORK/$name" --ready_file "$ready" --log_level "${SWEEP_LOG_LEVEL:-info}" "${DECODE_PIN[@]}" ${SWEEP_LAUNCHER_FLAGS:-} \
    ${flags:+--prefill_flags="$flags"} --decode_flags="$flags${SWEEP_TRACE:+${flags:+,}--log_level=debug}" \
    >"$WORK/$name.out" 2>&1 &
  PID[$name]=$!
  NAMES+=("$name")
  case ",$flags," in *,--spec_adaptive,*) ADAPTIVE+=("$name") ;; esac
  for _ in $(seq 1 600); do [ -s "$ready" ] && break; sleep 0.2; done
  [ -s "$ready" ] || { echo "$name: cluster did not start; see $WORK/$name.out" >&2; exit 1; }
  ROUTER[$name]=$(cat "$ready")
  if [ "$PIN" = 1 ]; then
    # The launcher started its decode nodes on the decode CPU (--decode_cpus): check it did.
    local pid cpus
    for pid in $(pgrep -P "${PID[$name]}" -f decode_node); do
      cpus=$(awk '/^Cpus_allowed_list/ {print $2}' "/proc/$pid/status")
      [ "$cpus" = "$DECODE_CPU" ] || { echo "$name: decode_node $pid runs on CPUs $cpus, not $DECODE_CPU" >&2; exit 1; }
    done
    [ -n "$(pgrep -P "${PID[$name]}" -f decode_node)" ] || { echo "$name: no decode_node child found" >&2; exit 1; }
  fi
}

for m in $METHODS; do
  if [ "$m" = off ]; then start_config off ""; continue; fi
  extra=""
  [ "$m" = draft_model ] && extra=",--draft_model=$(cd "$DRAFT" && pwd)"
  for k in $KS; do
    if [ "$k" = adaptive ]; then
      cap=$ADAPTIVE_K_DRAFT_MODEL
      flags=$ADAPTIVE_FLAGS_DRAFT_MODEL
      config=$ADAPTIVE_CONFIG_DRAFT_MODEL
      if [ "$m" = ngram ]; then
        cap=$ADAPTIVE_K_NGRAM
        flags=$ADAPTIVE_FLAGS_NGRAM
        config=$ADAPTIVE_CONFIG_NGRAM
      fi
      echo "$config" >"$WORK/$m-adaptive.spec.json"
      start_config "$m-adaptive" \
        "--speculative=$m,--num_speculative_tokens=$cap,--spec_adaptive,--spec_config=$WORK/$m-adaptive.spec.json$extra${flags:+,$flags}"
    else
      start_config "$m-k$k" "--speculative=$m,--num_speculative_tokens=$k$extra"
    fi
  done
done
# More configurations, each worker flag list comma-separated: an A/B of one flag in the same rounds.
for spec in ${SWEEP_EXTRA:-}; do start_config "${spec%%=*}" "${spec#*=}"; done
# The round's off runs after the first, each on a cluster of its own (see SWEEP_OFF_EVERY).
OFFS=()
if [ "$OFF_EVERY" -gt 0 ] && [ -n "${PID[off]:-}" ]; then
  OFFS=(off)
  others=$((${#NAMES[@]} - 1))
  for i in $(seq 2 $((1 + (others + OFF_EVERY - 1) / OFF_EVERY))); do
    start_config "off@$i" ""
    OFFS+=("off@$i")
  done
fi
CONFIGS=()
for name in "${NAMES[@]}"; do [ "${name%%@*}" = off ] && [ "$name" != off ] || CONFIGS+=("$name"); done
echo "started ${#NAMES[@]} clusters; logs in $WORK" >&2

# Rounds 1-WARMUP_ROUNDS-SELECTOR_WARMUP_ROUNDS..-WARMUP_ROUNDS run the adaptive nodes alone (their
# figures go nowhere), 1-WARMUP_ROUNDS..0 are the cold ones.
FIRST=$((1 - WARMUP_ROUNDS))
[ ${#ADAPTIVE[@]} -gt 0 ] && FIRST=$((FIRST - SELECTOR_WARMUP_ROUNDS))
for REPEAT in $(seq "$FIRST" "$REPEATS"); do
  out=$RESULTS
  [ "$REPEAT" -le 0 ] && out=$COLD
  round_configs=("${CONFIGS[@]}")
  if [ "$REPEAT" -le $((-WARMUP_ROUNDS)) ]; then
    out=/dev/null
    round_configs=("${ADAPTIVE[@]}")
  fi
  for c in $CONCURRENCY; do
    seed=$((1000 * (REPEAT + 100) + c))
    order=$(python3 - "$seed" "$OFF_EVERY" "${round_configs[@]}" <<'PY'
import random, sys
every, names = int(sys.argv[2]), sys.argv[3:]
others = [n for n in names if n != "off"] if every > 0 and "off" in names else names
random.Random(int(sys.argv[1])).shuffle(others)
order = others
if others is not names:
    order = ["off"]
    for i, n in enumerate(others):
        order.append(n)
        if (i + 1) % every == 0 or i + 1 == len(others):
            order.append("off")
print(" ".join(order))
PY
)
    slot=0
    offs=0
    for name in $order; do
      if [ "$name" = off ] && [ ${#OFFS[@]} -gt 0 ]; then
        name=${OFFS[$offs]}
        offs=$((offs + 1))
      fi
      run=$WORK/$name.r$REPEAT.c$c.s$slot.json
      # At least as many sessions as the concurrency: each session's turns run one after
      # another, so fewer sessions than c would never put c requests in flight.
      "${PINNED[@]}" "$BIN/tools/bench/bench" --target "${ROUTER[$name]}" --workload coding \
        --sessions "$((c > SESSIONS ? c : SESSIONS))" --coding_turns 3 --coding_context_words 250 \
        --coding_answer_tokens "$ANSWER" --mode closed --concurrency "$c" --warmup_sessions 1 \
        --seed "$seed" --json >"$run" 2>/dev/null
      python3 - "${name%%@*}" "$c" "$run" "$REPEAT" "$slot" >>"$out" <<'PY'
import json, sys
s = json.load(open(sys.argv[3]))["A"]
tpot = s["tpot_ms"]["mean"]
print("\t".join([sys.argv[4], sys.argv[1], sys.argv[2], sys.argv[5],
                 "%.1f" % s["output_token_throughput"],
                 "%.1f" % s["decode_token_throughput"],
                 "%.1f" % (1000.0 / tpot if tpot > 0 else 0.0),
                 "%.2f" % s["mean_accepted_length"], "%.2f" % s["draft_acceptance_rate"],
                 "%.1f" % s["ttft_ms"]["p90"], "%.2f" % s["itl_ms"]["p90"]]))
PY
      slot=$((slot + 1))
    done
    echo "round $REPEAT concurrency $c done" >&2
  done
done
stop_all
trap - EXIT
python3 - "$RESULTS" "$COLD" "$(dirname "$0")" <<'PY'
import csv, statistics, sys
sys.path.insert(0, sys.argv[3])
from spec_verdict import baseline_ratios
def table(path, title):
    rows = list(csv.DictReader(open(path), delimiter="\t"))
    if not rows:
        return
    print(title)
    keys = []
    by = {}
    for r in rows:
        k = (r["config"], r["concurrency"])
        if k not in by:
            keys.append(k)
            by[k] = []
        by[k].append(r)
    keys.sort(key=lambda k: (k[0] != "off", k[0], int(k[1])))
    # x/off: each run against no speculation beside it in its round (spec_verdict.py).
    by_field = {f: baseline_ratios(rows, f) for f in ("out_tok_s", "decode_tok_s", "stream_tok_s")}
    def ratios(rs, conc, field):
        return list(by_field[field].get((rs[0]["config"], int(conc)), {}).values())
    def med(rs, f):
        return statistics.median(float(r[f]) for r in rs)
    print("%-20s %4s %9s %9s %9s %8s %6s %8s %7s %7s %7s %7s %9s" % ("config", "conc",
          "out tok/s", "dec tok/s", "str tok/s", "tok/step", "accept", "TTFT p90", "ITL p90",
          "out/off", "dec/off", "str/off", "dec range"))
    def mr(r):
        return "%.3f" % statistics.median(r) if r else "-"
    for k in keys:
        rs = by[k]
        out = ratios(rs, k[1], "out_tok_s")
        dec = ratios(rs, k[1], "decode_tok_s")
        stream = ratios(rs, k[1], "stream_tok_s")
        print("%-20s %4s %9.1f %9.1f %9.1f %8.2f %6.2f %8.1f %7.2f %7s %7s %7s %9s" % (k[0],
              k[1], med(rs, "out_tok_s"), med(rs, "decode_tok_s"), med(rs, "stream_tok_s"),
              med(rs, "tokens_per_step"), med(rs, "acceptance"), med(rs, "ttft_p90_ms"),
              med(rs, "itl_p90_ms"), mr(out), mr(dec), mr(stream),
              "%.2f-%.2f" % (min(dec), max(dec)) if dec else "-"))
table(sys.argv[2], "cold rounds (left out of the table below):")
table(sys.argv[1], "measured rounds (medians; x/off: median of the per-round ratios to the off runs beside each run):")
PY
python3 "$(dirname "$0")/spec_verdict.py" "$RESULTS"
echo "raw results: $RESULTS (cold rounds: $COLD)"
