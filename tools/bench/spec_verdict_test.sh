#!/usr/bin/env bash
# spec_verdict.py on a hand-made results file (testdata/spec_results.tsv; the figures below are
# worked out by hand from its decode_tok_s column).
set -euo pipefail
tool=$1
results=$2
slotted=$3
got=$(python3 "$tool" "$results")
# c=1: ratios to off k1 1.2 1.3 1.1, k2 1.5 1.4 1.4, adaptive 1.6 1.35 1.5 (medians 1.2, 1.4,
# 1.5); c=8: k1 0.9 0.95 1.05, k2 0.8 0.85 0.7, adaptive 0.95 0.99 0.9 (0.95, 0.8, 0.95).
want='ngram        c=1   adaptive 1.500, best fixed k2 1.400: at least (rounds won 2/3); no speculation: at least (rounds 3/3)
ngram        c=8   adaptive 0.950, best fixed k1 0.950: at least (rounds won 2/3); no speculation: below (rounds 0/3)  <- not met
criterion met in 1 of 2 cells'
if [ "$got" != "$want" ]; then
  diff <(echo "$want") <(echo "$got") || true
  echo "FAIL: verdict differs"
  exit 1
fi
# Another column: tokens_per_step is 1.00 everywhere, so every ratio is 1.
got=$(python3 "$tool" --field tokens_per_step "$results" | tail -1)
[ "$got" = "criterion met in 2 of 2 cells" ] || { echo "FAIL: --field: $got"; exit 1; }
# With slots, each run against the off runs on either side of it, interpolated by slot (the
# nearest at an end): c=1 round 1 off 100 / 130 at slots 0 / 3: k1 121 at 1 -> 121 / 110 = 1.1,
# adaptive 150 at 2 -> 150 / 120 = 1.25, k2 156 at 4 -> 156 / 130 = 1.2; round 2 (off 100 at
# 0, 2, 5): adaptive 1.3, k2 1.1, k1 1.0; round 3 (off 100, 100, 130 at 0, 2, 5): k2 1.3,
# adaptive 120 / 110, k1 121 / 120. Medians: k1 1.00833, k2 1.2, adaptive 1.25; adaptive ahead
# of k2 in rounds 1 and 2. Against the round's last off run alone (as without slots) k2 would
# be 1.2 / 1.1 / 1.0 and adaptive 1.154 / 1.3 / 0.923.
got=$(python3 "$tool" "$slotted")
want='ngram        c=1   adaptive 1.250, best fixed k2 1.200: at least (rounds won 2/3); no speculation: at least (rounds 3/3)
criterion met in 1 of 1 cells'
if [ "$got" != "$want" ]; then
  diff <(echo "$want") <(echo "$got") || true
  echo "FAIL: slotted verdict differs"
  exit 1
fi
rc=0
echo "not a results file" >"${TEST_TMPDIR:-/tmp}/bad.tsv"
python3 "$tool" "${TEST_TMPDIR:-/tmp}/bad.tsv" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || { echo "FAIL: a bad file gave exit status $rc"; exit 1; }
echo PASS
