#!/usr/bin/env bash
# The test command: installs what the build needs, builds everything (CUDA targets included),
# runs every test that needs no GPU, and ends with one line "N passed, M failed" counted from
# Bazel's per-target results. Exits non-zero on any failure.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh //engine/...    # a subset (any bazel target patterns)
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh || { echo "0 passed, 1 failed"; exit 1; }

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(//...)

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# --keep_going: report every failing target, not just the first.
bazel test --keep_going --jobs=2 --local_test_jobs=2 --test_tag_filters=-gpu \
  --test_timeout=60,300,900,1800 -- "${targets[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

# Summary lines look like "//pkg:target   (cached) PASSED in 0.1s" or "... FAILED in 2.0s",
# "TIMEOUT", "FLAKY", "NO STATUS", "FAILED TO BUILD".
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$log")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  # The build itself failed (or Bazel did): count it as a failure so the line never says 0.
  failed=1
fi
echo "$passed passed, $failed failed"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
