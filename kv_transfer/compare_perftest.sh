#!/usr/bin/env bash
# Compares //kv_transfer:bench with UCX's own ucx_perftest (ucp_put_bw) on the same transport,
# in the same run, for 1 MiB transfers. Prints both figures and their ratio per transport.
#   kv_transfer/compare_perftest.sh            # from the repo root; builds the bench with -c opt
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //kv_transfer:bench >/dev/null 2>&1
BENCH=bazel-bin/kv_transfer/bench
SIZE=1048576
N=2000
export UCX_WARN_UNUSED_ENV_VARS=n

run_one() {  # $1 label, $2 UCX_TLS, then extra env assignments
  local label=$1 tls=$2; shift 2
  local port=$((20000 + RANDOM % 20000))
  # ucx_perftest: server then client; the client prints the final "Final:" line.
  env UCX_TLS="$tls" "$@" ucx_perftest -p "$port" -t ucp_put_bw -s $SIZE -n $N >/dev/null 2>&1 &
  local srv=$!
  sleep 1
  local perf
  perf=$(env UCX_TLS="$tls" "$@" ucx_perftest 127.0.0.1 -p "$port" -t ucp_put_bw -s $SIZE -n $N \
           -f 2>/dev/null | awk '/^ *[0-9]/{bw=$6} END{print bw}')
  wait $srv || true
  # perftest reports MB/s with MB = 2^20 bytes; convert to GB/s (1e9 bytes).
  local perf_gbs
  perf_gbs=$(awk -v m="$perf" 'BEGIN{printf "%.3f", m*1048576/1e9}')
  local meta
  meta=$(mktemp -u /tmp/kv_bench_meta.XXXXXX)
  env UCX_TLS="$tls" "$@" $BENCH --role=server --metadata="$meta" --pool_bytes=$((256 << 20)) &
  srv=$!
  local ours
  ours=$(env UCX_TLS="$tls" "$@" $BENCH --role=client --metadata="$meta" \
           --pool_bytes=$((256 << 20)) --block_sizes=$SIZE --batches=256 --iterations=8 |
         awk '$1 ~ /^[0-9]/{print $3}')
  wait $srv || true
  rm -f "$meta"
  awk -v l="$label" -v t="$tls" -v p="$perf_gbs" -v o="$ours" 'BEGIN{
      printf "%-5s UCX_TLS=%-12s ucx_perftest ucp_put_bw %7.3f GB/s  kv_transfer bench %7.3f GB/s  ratio %.2f\n",
             l, t, p, o, o / p }'
}

run_one shm "sm,self"
run_one tcp "tcp,self" UCX_TCP_TX_SEG_SIZE=512k UCX_TCP_RX_SEG_SIZE=512k
