#!/usr/bin/env bash
# Fair comparison of //kv_transfer:bench with UCX's own ucx_perftest (ucp_put_bw) on the same
# transport in the same run, for SIZE-byte transfers (default 1 MiB).
#
#   kv_transfer/compare_perftest.sh [ROUNDS]        # from the repo root; builds bench with -c opt
#   ROUNDS=5 SIZE=1048576 TRANSPORTS="shm tcp" kv_transfer/compare_perftest.sh
#
# What "fair" means here:
#  * Same transport and environment for both tools (UCX_TLS plus the TCP settings below).
#  * Same message size, same volume: ucx_perftest puts SIZE bytes ITERS times (after WARMUP
#    warm-up puts) with at most WINDOW outstanding; the bench posts batches of WINDOW blocks of
#    SIZE bytes, ITERS / WINDOW times (after warming its pool), so both move ITERS * SIZE bytes.
#    The bench flushes at the end of every post and sends one notification per post, as the KV
#    protocol requires; ucx_perftest flushes once at the end.
#  * Same memory footprint: ucx_perftest reuses one SIZE buffer on each side (cache resident);
#    "bench/1blk" does the same (--pool_bytes=SIZE, every block of a batch hits the same bytes).
#    That pair is the headline ratio, because it is the only like-for-like one. "bench/pool"
#    streams through a POOL-byte pool on each side like a real KV cache: it shows what memory
#    bandwidth leaves, and ucx_perftest has no equivalent.
#  * Both tools allocate their memory through UCX (ucx_perftest: ucp_mem_map ALLOCATE; bench:
#    TransferAgent::AllocateMemory), so over shared memory both write straight into the peer's
#    mapping.
#  * The machine is shared: each round runs every tool once, the order alternating between
#    rounds, and the table reports best-of-N and median-of-N. `uptime` is printed before and
#    after.
#  * TCP is also judged against the kernel's own TCP: one plain stream over loopback (two
#    processes, 1 MiB send()/recv_into() calls), measured in the same rounds.
#
# TCP settings: UCX 1.13 emulates puts over TCP with active messages of at most one segment, so
# the segment size sets how many messages and copies a 1 MiB put costs. UCX's defaults (8 KiB out,
# 64 KiB in) are several times slower than 1 MiB segments, which the UCX backend now uses unless
# UCX_TCP_{TX,RX}_SEG_SIZE are set; TCP_ENV passes the same settings to both tools explicitly.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-${ROUNDS:-5}}
SIZE=${SIZE:-1048576}
ITERS=${ITERS:-2048}
WINDOW=${WINDOW:-256}
WARMUP=${WARMUP:-256}
POOL=${POOL:-$((256 << 20))}
INFLIGHT=${INFLIGHT:-2}
TRANSPORTS=${TRANSPORTS:-"shm tcp"}
TCP_ENV=${TCP_ENV:-"UCX_TCP_TX_SEG_SIZE=1m UCX_TCP_RX_SEG_SIZE=1m"}
bazel build -c opt //kv_transfer:bench >/dev/null 2>&1
BENCH=bazel-bin/kv_transfer/bench
export UCX_WARN_UNUSED_ENV_VARS=n
WORK=$(mktemp -d /tmp/kv_compare.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# ucx_perftest ucp_put_bw; prints two GB/s figures (1e9 bytes/s): the overall bandwidth it reports,
# and SIZE divided by its median per-put time. Over shared memory a put is one synchronous copy, so
# the latter is the speed of the bare copy with the stalls a shared machine adds left out: an upper
# bound no tool that also waits for the scheduler reaches. Args: env assignments.
perftest() {
  local port=$((20000 + RANDOM % 20000))
  env "$@" ucx_perftest -p "$port" -t ucp_put_bw -s "$SIZE" -n "$ITERS" -w "$WARMUP" \
    -O "$WINDOW" >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  local line
  line=$(env "$@" ucx_perftest 127.0.0.1 -p "$port" -t ucp_put_bw -s "$SIZE" -n "$ITERS" \
           -w "$WARMUP" -O "$WINDOW" -f 2>/dev/null | awk '/^ *[0-9]/{l=$0} END{print l}')
  wait $srv || true
  # -f prints one line: iterations, per-put time (median, average, overall) in usec, then
  # bandwidth (average, overall) in MB/s with MB = 2^20 bytes.
  echo "${line:-0 0 0 0 0 0}" | awk -v size="$SIZE" '{
    printf "%.3f %.3f\n", $6 * 1048576 / 1e9, ($2 > 0 ? size / $2 / 1e3 : 0) }'
}

# //kv_transfer:bench; prints GB/s. Args: pool bytes, then env assignments.
bench() {
  local pool=$1; shift
  local meta="$WORK/meta.$RANDOM"
  env "$@" $BENCH --role=server --metadata="$meta" --pool_bytes="$pool" 2>/dev/null &
  local srv=$!
  local gbs
  gbs=$(env "$@" $BENCH --role=client --metadata="$meta" --pool_bytes="$pool" \
          --block_sizes="$SIZE" --batches="$WINDOW" --iterations=$((ITERS / WINDOW)) \
          --inflight="$INFLIGHT" 2>/dev/null | awk '$1 ~ /^[0-9]/{print $3}')
  wait $srv || true
  echo "${gbs:-0}"
}

kernel_tcp() {  # one plain TCP stream over loopback; prints GB/s
  python3 - "$((ITERS * SIZE >> 20))" <<'EOF'
import os, socket, sys, time
mib = int(sys.argv[1])
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
if os.fork() == 0:
    c, _ = srv.accept(); mv = memoryview(bytearray(1 << 20)); got = 0
    while got < mib << 20:
        n = c.recv_into(mv)
        if n == 0: break
        got += n
    c.sendall(b"k"); os._exit(0)
s = socket.create_connection(srv.getsockname()); buf = bytearray(1 << 20)
t0 = time.perf_counter()
for _ in range(mib): s.sendall(buf)
s.recv(1); dt = time.perf_counter() - t0; os.wait()
print(f"{(mib << 20) / dt / 1e9:.3f}")
EOF
}

stats() {  # stdin: numbers; prints "best median"
  sort -g | awk '{v[NR]=$1} END{m = NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2;
                               printf "%.3f %.3f\n", v[NR], m}'
}

echo "load before: $(uptime)"
echo "size=$SIZE iters=$ITERS window=$WINDOW warmup=$WARMUP pool=$POOL inflight=$INFLIGHT" \
     "rounds=$ROUNDS tcp: $TCP_ENV"
for t in $TRANSPORTS; do
  case $t in
    shm) envs=(UCX_TLS=sm,self) ;;
    tcp) read -r -a extra <<<"$TCP_ENV"; envs=(UCX_TLS=tcp,self "${extra[@]}") ;;
    *) echo "unknown transport $t (expected shm or tcp)" >&2; exit 2 ;;
  esac
  : >"$WORK/$t.perftest"; : >"$WORK/$t.p50"; : >"$WORK/$t.bench1"; : >"$WORK/$t.benchpool"; : >"$WORK/$t.kernel"
  for ((r = 1; r <= ROUNDS; r++)); do
    if ((r % 2)); then
      perftest "${envs[@]}" >>"$WORK/$t.pt"
      bench "$SIZE" "${envs[@]}" >>"$WORK/$t.bench1"
      bench "$POOL" "${envs[@]}" >>"$WORK/$t.benchpool"
    else
      bench "$POOL" "${envs[@]}" >>"$WORK/$t.benchpool"
      bench "$SIZE" "${envs[@]}" >>"$WORK/$t.bench1"
      perftest "${envs[@]}" >>"$WORK/$t.pt"
    fi
    if [[ $t == tcp ]]; then kernel_tcp >>"$WORK/$t.kernel"; fi
  done
  awk '{print $1}' "$WORK/$t.pt" >"$WORK/$t.perftest"
  awk '{print $2}' "$WORK/$t.pt" >"$WORK/$t.p50"
done
echo "load after:  $(uptime)"
echo
printf "%-4s %-34s %-26s %8s %8s  %s\n" tls tool footprint "best" "median" "all rounds (GB/s)"
for t in $TRANSPORTS; do
  tls=$([[ $t == shm ]] && echo sm,self || echo tcp,self)
  row() {  # file, tool, footprint
    read -r best med < <(stats <"$1")
    printf "%-4s %-34s %-26s %8s %8s  %s\n" "$t" "$2" "$3" "$best" "$med" "$(tr '\n' ' ' <"$1")"
  }
  row "$WORK/$t.perftest" "ucx_perftest ucp_put_bw (overall)" "1 buffer of $SIZE B"
  # Over TCP a put completes locally (the flush waits), so its median time means nothing there.
  if [[ $t == shm ]]; then row "$WORK/$t.p50" "ucx_perftest (size / median put)" "1 buffer"; fi
  row "$WORK/$t.bench1" "kv_transfer bench (bench/1blk)" "1 block (cache resident)"
  row "$WORK/$t.benchpool" "kv_transfer bench (bench/pool)" "$((POOL >> 20)) MiB pool"
  if [[ $t == tcp ]]; then row "$WORK/$t.kernel" "kernel TCP, 1 stream (python)" "1 MiB buffer"; fi
  read -r pb pm < <(stats <"$WORK/$t.perftest")
  read -r qb qm < <(stats <"$WORK/$t.p50")
  read -r bb bm < <(stats <"$WORK/$t.bench1")
  read -r lb lm < <(stats <"$WORK/$t.benchpool")
  awk -v t="$t" -v tls="$tls" -v pb="$pb" -v pm="$pm" -v qb="$qb" -v qm="$qm" -v bb="$bb" \
      -v bm="$bm" -v lb="$lb" -v lm="$lm" 'BEGIN{
    printf "%-4s UCX_TLS=%-9s HEADLINE bench/1blk : perftest overall  best %.2f  median %.2f\n",
           t, tls, bb / pb, bm / pm
    if (t == "shm") printf "%-4s %17s bench/1blk : perftest size/median-put  best %.2f  median %.2f\n",
           t, "", bb / qb, bm / qm
    printf "%-4s %17s bench/pool : perftest overall  best %.2f  median %.2f\n", t, "", lb / pb,
           lm / pm }'
done
