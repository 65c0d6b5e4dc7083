#!/usr/bin/env bash
# Runs //prefill_node:stream_bench on this tree, then on BASE (a commit from before layer-wise KV
# streaming), with the same flags, one after the other on the same machine:
#   prefill_node/stream_bench_base.sh BASE --model $PWD/models/demo --prompt_tokens 2000
# BASE has neither PrefillServiceOptions::layer_streaming nor transfer_exposed_us: it posts the
# whole transfer after the prefill (all of it exposed), so its bench reports transfer_us as the
# exposed figure and its "streamed" and "after-prefill" rows are the same code.
# STREAM_BENCH_BASE_DIR (default /tmp/stream-bench-base) receives BASE's tree; its Bazel server
# is shut down at the end.
set -euo pipefail
base=$1
shift
root=$(git rev-parse --show-toplevel)
work=${STREAM_BENCH_BASE_DIR:-/tmp/stream-bench-base}
rm -rf "$work"
mkdir -p "$work"
git -C "$root" archive "$base" | tar -x -C "$work"
sed -e '/layer_streaming = false;/d' \
    -e 's/response.transfer_exposed_us()/response.transfer_us()/' \
    "$root/prefill_node/stream_bench.cc" >"$work/prefill_node/stream_bench.cc"
sed -n '/^# TTFT of one long prompt/,$p' "$root/prefill_node/BUILD.bazel" \
    >>"$work/prefill_node/BUILD.bazel"
(cd "$root" && bazel build -c opt //prefill_node:stream_bench)
(cd "$work" && bazel build -c opt //prefill_node:stream_bench)
echo "== this tree ($(git -C "$root" rev-parse --short HEAD))"
"$root/bazel-bin/prefill_node/stream_bench" "$@" 2>&1 | grep -v '^\[20'
echo "== base $base"
"$work/bazel-bin/prefill_node/stream_bench" "$@" 2>&1 | grep -v '^\[20'
(cd "$work" && bazel shutdown)
