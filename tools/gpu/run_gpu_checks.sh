#!/usr/bin/env bash
# Runs every prebuilt gpu-tagged test binary in DIR/bin, then every benchmark in DIR/bench, on a
# machine with a GPU, a CUDA 13 capable driver and no Bazel, and writes DIR/gpu_report.txt
# (pass/fail/skip per test, seconds, the failing assertions, the benchmarks' output).
# Usage: run_gpu_checks.sh DIR [per-test timeout seconds, 300] [test jobs, 1]
# The tests may run several at a time (they share the GPU; their CPU references use the host's
# cores); the benchmarks always run one at a time, after the tests, so their timings are alone on
# the device.
# Exit status: 0 when every test passed and every benchmark ran, 1 otherwise (a test that skips
# everything counts as a failure here: on this machine a skip means the GPU was not usable).
set -uo pipefail
dir="${1:?usage: $0 DIR [timeout_s] [jobs]}"
limit="${2:-300}"
jobs="${3:-1}"
dir=$(cd "$dir" && pwd)  # the tests run in DIR/data
report="$dir/gpu_report.txt"
# cuBLAS(Lt) 13 is not packed (pack_gpu_tests.sh): the toolkit's, or the nvidia-cublas wheel's.
cublas_wheel=$(python3 -c 'import os, nvidia.cublas as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$dir/lib${cublas_wheel:+:$cublas_wheel}:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  echo "gpu checks $(date -u +%FT%TZ) commit $(cat "$dir/COMMIT" 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4
} > "$report"

# One test binary: its log in DIR/NAME.log, its report line(s) in DIR/NAME.verdict.
run_test() {
  local bin="$1" name log start rc secs passed skipped failures verdict
  name=$(basename "$bin")
  log="$dir/$name.log"
  start=$(date +%s.%N)
  # In DIR/data: the packed runfiles (models, fixtures) at their workspace-relative paths.
  (cd "$dir/data" 2>/dev/null || cd "$dir"; timeout "$limit" "$bin" --gtest_brief=0) > "$log" 2>&1
  rc=$?
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  passed=$(grep -c '^\[       OK \]' "$log")
  skipped=$(grep -c '^\[  SKIPPED \].*ms)$' "$log")
  failures=$(grep -c '^\[  FAILED  \].*(' "$log")
  if [ "$rc" -eq 0 ] && [ "$passed" -gt 0 ]; then
    verdict=PASS
  elif [ "$rc" -eq 124 ]; then
    verdict="FAIL (timeout ${limit}s)"
  elif [ "$rc" -eq 0 ]; then
    verdict="FAIL (everything skipped: no usable GPU?)"
  else
    verdict="FAIL (exit $rc)"
  fi
  {
    printf '%-32s %-44s %8.2fs  ok=%s skipped=%s failed=%s\n' "$name" "$verdict" "$secs" \
      "$passed" "$skipped" "$failures"
    if [ "$verdict" != PASS ]; then
      grep -B2 -A6 -E 'Failure|FAILED|error|Skipped' "$log" | head -40 | sed 's/^/    /'
    fi
  } > "$dir/$name.verdict"
}

tests=()
for bin in "$dir"/bin/*; do
  [ -x "$bin" ] && tests+=("$bin")
done
running=0
for bin in "${tests[@]}"; do
  run_test "$bin" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait
failed=0
for bin in "${tests[@]}"; do
  name=$(basename "$bin")
  if [ -f "$dir/$name.verdict" ]; then
    cat "$dir/$name.verdict" >> "$report"
    head -1 "$dir/$name.verdict" | grep -q ' PASS ' || failed=1
  else
    echo "$name: no verdict (the runner died)" >> "$report"; failed=1
  fi
done
# Benchmarks (DIR/bench/*): their output goes into the report; a failing one fails the run.
for bin in "$dir"/bench/*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  echo "== $name" >> "$report"
  if ! timeout "$limit" "$bin" >> "$report" 2>&1; then
    echo "FAIL ($name exited non-zero)" >> "$report"; failed=1
  fi
done
cat "$report"
exit "$failed"
