#!/usr/bin/env bash
# step_trace_summary.py on hand-made step-trace lines: the figures are checked against the
# arithmetic done by hand (see the lines in testdata/step_trace*.log).
set -euo pipefail
tool=$1
dir=$(dirname "$2")
cd "$dir"
got=$(python3 "$OLDPWD/$tool" step_trace.log step_trace_node.log)
want='step_trace.log: 5 steps, 0.023 s, 12 tokens, 521.7 tokens/s
mode     n  steps  time%   period  forward    draft verified accepted tok/step  ms/tok
-1       1      1   13.0     3.00     2.50     0.40     1.00     1.00     2.00    1.50
0        2      2   34.8     4.00     3.00     0.00     0.00     0.00     2.00    2.00
1        2      2   52.2     6.00     5.00     0.60     2.00     1.00     3.00    2.00
step_trace_node.log: 1 steps, 0.009 s, 6 tokens, 666.7 tokens/s
mode     n  steps  time%   period  forward    draft verified accepted tok/step  ms/tok
node     3      1  100.0     9.00     8.00     0.70     3.00     3.00     6.00    1.50'
if [ "$got" != "$want" ]; then
  diff <(echo "$want") <(echo "$got") || true
  echo "FAIL: summary differs"
  exit 1
fi
# --skip 0.5 drops the first 3 of the 6 step lines (the period-0 one and both of mode 0).
got=$(python3 "$OLDPWD/$tool" --skip 0.5 step_trace.log | sed -n 1p)
[ "$got" = "step_trace.log: 3 steps, 0.015 s, 8 tokens, 533.3 tokens/s" ] || { echo "FAIL: --skip: $got"; exit 1; }
if python3 "$OLDPWD/$tool" --skip 1 step_trace.log 2>/dev/null; then echo "FAIL: --skip 1 accepted"; exit 1; fi
# --trials on hand-made lines (testdata/step_trace_trials.log): the trial of mode 1 (after two
# unmeasured warm-up steps) emits 6 + 8 + 8 tokens in 12 ms against the plan's 8 + 10 + 10 in
# 15 ms: (22 / 12) / (28 / 15) = 0.982; the trial of mode 0, 2 steps a side (10 tokens in 6 ms
# against 20 in 10), only with --min_steps 2: 0.833.
trials_want='step_trace_trials.log: steps 5-10, mode 1 vs -1, decoding 4-5, measured 3/3, rate ratio 0.982'
got=$(python3 "$OLDPWD/$tool" --trials step_trace_trials.log)
[ "$got" = "$trials_want" ] || { echo "FAIL: --trials: $got"; exit 1; }
got=$(python3 "$OLDPWD/$tool" --trials --min_steps 2 step_trace_trials.log | sed -n 2p)
[ "$got" = 'step_trace_trials.log: steps 14-17, mode 0 vs -1, decoding 5-5, measured 2/2, rate ratio 0.833' ] ||
  { echo "FAIL: --trials --min_steps 2: $got"; exit 1; }
if python3 "$OLDPWD/$tool" --trials --min_steps 0 step_trace_trials.log 2>/dev/null; then
  echo "FAIL: --min_steps 0 accepted"
  exit 1
fi
# --runs on hand-made lines (testdata/step_trace_runs.log). Run 1 (steps 1-6, one decoding
# sequence): the first step has no period and is left out; then a catch-up step (1 token, 4 ms),
# two steady ones (3 + 5 tokens, 2 + 2 ms), an unmeasured one of mode 2 (warm-up, 2 tokens, 2 ms)
# and one that carried 20 tokens for 1 sequence and 2 drafts (prefill, 3 tokens, 6 ms): 14 tokens
# in 16 ms. Run 2 (10 s later, a node without the selector at 3 and 2 sequences, measured=0 on
# both: steady): 6 + 2 tokens in 3 + 1 ms.
runs_all='step_trace_runs.log run 1 (steps 1-6, peak 1): 5 steps, 0.016 s, 0.875 tokens/ms | steady 25.0% 2.000 | catch-up 25.0% 0.250 | prefill 37.5% 0.500 | warm-up 12.5% 1.000
step_trace_runs.log run 2 (steps 7-8, peak 3): 2 steps, 0.004 s, 2.000 tokens/ms | steady 100.0% 2.000
step_trace_runs.log: 2 runs, 7 steps, 0.020 s, 1.100 tokens/ms | steady 40.0% 2.000 | catch-up 20.0% 0.250 | prefill 30.0% 0.500 | warm-up 10.0% 1.000'
got=$(python3 "$OLDPWD/$tool" --runs step_trace_runs.log)
[ "$got" = "$runs_all" ] || { diff <(echo "$runs_all") <(echo "$got") || true; echo "FAIL: --runs"; exit 1; }
got=$(python3 "$OLDPWD/$tool" --runs --peak 1-1 step_trace_runs.log | sed -n 2p)
[ "$got" = 'step_trace_runs.log: 1 runs, 5 steps, 0.016 s, 0.875 tokens/ms | steady 25.0% 2.000 | catch-up 25.0% 0.250 | prefill 37.5% 0.500 | warm-up 12.5% 1.000' ] ||
  { echo "FAIL: --runs --peak 1-1: $got"; exit 1; }
got=$(python3 "$OLDPWD/$tool" --runs --last 1 step_trace_runs.log | sed -n 1p)
[ "$got" = 'step_trace_runs.log run 2 (steps 7-8, peak 3): 2 steps, 0.004 s, 2.000 tokens/ms | steady 100.0% 2.000' ] ||
  { echo "FAIL: --runs --last 1: $got"; exit 1; }
# A gap wider than the 10 s between the runs makes them one run.
got=$(python3 "$OLDPWD/$tool" --runs --gap 20 step_trace_runs.log | sed -n 1p)
[ "${got%%:*}" = 'step_trace_runs.log run 1 (steps 1-8, peak 3)' ] || { echo "FAIL: --gap 20: $got"; exit 1; }
for bad in "--peak 3-1" "--peak x" "--gap 0" "--last -1"; do
  # shellcheck disable=SC2086
  if python3 "$OLDPWD/$tool" --runs $bad step_trace_runs.log 2>/dev/null; then
    echo "FAIL: $bad accepted"
    exit 1
  fi
done
echo PASS
