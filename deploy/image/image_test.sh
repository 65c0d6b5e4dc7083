#!/usr/bin/env bash
# The image end to end, as a container runtime would use it but with what this machine has
# (no container daemon): builds the CPU image (deploy/image/build_image.sh), unpacks its OCI
# layout with umoci, and in a private mount namespace (unshare) chroots into the rootfs as the
# image's user (65532) to
#   1. check the image holds no compiler, no apt lists or caches, no secrets (/root, SSH host
#      keys, private keys), an empty resolv.conf, and the user the manifests run as;
#   2. run `--help` of every binary (each loads all its shared libraries from the image);
#   3. start the image's default command, the launcher (router + 1 prefill + 1 decode), on
#      models/demo bind-mounted read-only at /models/model, time container start -> SERVING (the
#      launcher's ready file: every worker registered, the router serving), and get a chat answer
#      through the router with the image's own chat binary.
#
#   sudo deploy/image/image_test.sh [OUT_DIR]     # OUT_DIR default: a new temporary directory
#   IMAGE_DIR=OUT_DIR deploy/image/image_test.sh  # reuse an image build_image.sh already made
#
# Slow (the optimised Bazel build, debootstrap from the network) and needs root: not a Bazel test,
# so scripts/test.sh never runs it. Prints "PASS" and the figures last.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

[ "$(id -u)" = 0 ] || { echo "image_test: needs root (unshare --mount, chroot)" >&2; exit 1; }
out=${IMAGE_DIR:-${1:-$(mktemp -d /tmp/deepinfer-image.XXXXXX)}}
if [ -z "${IMAGE_DIR:-}" ]; then
  start=$(date +%s)
  deploy/image/build_image.sh "$out"
  echo "image_test: image built in $(( $(date +%s) - start ))s"
fi
tag=$(cat "$out/TAG")
ref=${tag##*:}
work=$(mktemp -d /tmp/deepinfer-image-run.XXXXXX)
cleanup() {
  [ -n "${pid:-}" ] && kill -KILL "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; cat "$work"/*.out >&2 2>/dev/null || true; exit 1; }

umoci unpack --image "$out/oci:$ref" "$work/bundle" >/dev/null
rootfs="$work/bundle/rootfs"

# --- 1. Contents ------------------------------------------------------------------------------
for cc in gcc cc g++ c++ cpp clang ld as x86_64-linux-gnu-gcc-12 x86_64-linux-gnu-g++-12; do
  [ ! -e "$rootfs/usr/bin/$cc" ] && [ ! -e "$rootfs/usr/local/bin/$cc" ] ||
    fail "compiler $cc in the image"
done
[ -z "$(find "$rootfs/usr/lib/gcc" -name cc1\* 2>/dev/null)" ] || fail "cc1 in the image"
toolchain=$(grep -E '^Package: (gcc|g\+\+|cpp|clang|binutils|make)(-[0-9.]+)?$' \
  "$rootfs/var/lib/dpkg/status" || true)
[ -z "$toolchain" ] || fail "toolchain packages installed: $toolchain"
apt_files=$(find "$rootfs/var/lib/apt/lists" "$rootfs/var/cache/apt" -type f 2>/dev/null)
[ -z "$apt_files" ] || fail "apt lists or caches: $(echo "$apt_files" | head)"
# /root: only base-files' .bashrc and .profile (no history, SSH or cloud credentials, netrc...).
extra=$(find "$rootfs/root" -mindepth 1 ! -name .bashrc ! -name .profile 2>/dev/null)
[ -z "$extra" ] || fail "/root holds more than the base-files skeleton: $extra"
[ -z "$(find "$rootfs/etc/ssh" -name 'ssh_host_*' 2>/dev/null)" ] || fail "SSH host keys"
[ ! -s "$rootfs/etc/resolv.conf" ] || fail "the build host's resolv.conf"
keys=$(grep -rlsI -e "PRIVATE KEY-----" "$rootfs"/{etc,root,home,opt,var,usr/local} || true)
[ -z "$keys" ] || fail "private keys: $keys"
grep -q '^deepinfer:x:65532:65532:' "$rootfs/etc/passwd" || fail "no user deepinfer (65532)"
cuda_found=$(find "$rootfs" -xdev \( -name 'libcuda*.so*' -o -name 'libcublas*' \
  -o -name 'libnccl*' -o -name 'libcudnn*' -o -name 'libcufft*' -o -name 'libcurand*' \
  -o -name 'libcusparse*' -o -name 'libcusolver*' -o -name 'libnvrtc*' \) -print)
[ -z "$cuda_found" ] || fail "CUDA libraries in the CPU image: $cuda_found"
echo "image_test: contents ok (no compiler, apt caches or secrets; user 65532)"

# Runs a command in the unpacked image: its own mount namespace with /proc, /dev, /tmp and the
# model bound in, as the image's user, the network (loopback) shared with the host.
in_image() {
  unshare --mount --fork -- sh -c '
    set -e
    r=$1 model=$2; shift 2
    mount --rbind /dev "$r/dev"
    mount -t proc proc "$r/proc"
    mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
    mkdir -p "$r/models/model"
    mount --bind -o ro "$model" "$r/models/model"
    exec chroot --userspec=65532:65532 "$r" env -i PATH=/usr/local/bin:/usr/bin:/bin \
      HOME=/var/lib/deepinfer TMPDIR=/tmp "$@"' in_image "$rootfs" "$repo/models/demo" "$@"
}

# --- 2. --help of every binary ----------------------------------------------------------------
for b in router prefill_node decode_node vision_encoder launcher chat bench; do
  rc=0
  in_image "/usr/local/bin/$b" --help >"$work/help.$b.out" 2>&1 || rc=$?
  # absl's --help exits 1 after printing the flags; a missing library exits 127 before that.
  grep -q -- "--help" "$work/help.$b.out" || grep -qi "flags" "$work/help.$b.out" ||
    fail "$b --help (exit $rc): $(head -5 "$work/help.$b.out")"
  ! grep -q "error while loading shared libraries" "$work/help.$b.out" ||
    fail "$b: $(cat "$work/help.$b.out")"
done
echo "image_test: --help of router prefill_node decode_node vision_encoder launcher chat bench ok"

# --- 3. The cluster from the image ------------------------------------------------------------
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
# The image's default command (build_image.sh), with a free loopback port and a ready file.
t0=$(date +%s.%N)
in_image sh -c "exec /usr/local/bin/launcher --model=/models/model --router_listen=127.0.0.1:$port \
  --router_flags=--allow_anonymous \
  --kv_blocks=256 --threads=1 --ready_file=/tmp/ready --log_dir=/tmp/logs --startup_timeout=120s \
  >/tmp/launcher.out 2>&1 & pid=\$!
  for i in \$(seq 1 1200); do [ -s /tmp/ready ] && break; kill -0 \$pid || break; sleep 0.05; done
  [ -s /tmp/ready ] || { cat /tmp/launcher.out /tmp/logs/*.log; exit 1; }
  date +%s.%N > /tmp/serving
  /usr/local/bin/chat --router 127.0.0.1:$port --message Hello --max_tokens 8 \
    > /tmp/chat.out 2>&1 || { cat /tmp/chat.out; exit 1; }
  cat /tmp/chat.out; echo SERVING_AT \$(cat /tmp/serving)
  kill -INT \$pid; wait \$pid" >"$work/cluster.out" 2>&1 || fail "cluster in the image"
t1=$(grep -Eo 'SERVING_AT [0-9.]+' "$work/cluster.out" | awk '{print $2}')
[ -n "$t1" ] || fail "no SERVING time"
grep -q "completion 8 tokens" "$work/cluster.out" || grep -q "finish STOP" "$work/cluster.out" ||
  fail "no chat answer"
start_to_serving=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
echo "image_test: chat through the router in the image:"
sed 's/^/  /' "$work/cluster.out" | grep -v SERVING_AT
compressed=$(python3 - "$out/oci" "$ref" <<'EOF'
import json, sys
layout, ref = sys.argv[1], sys.argv[2]
index = json.load(open(layout + "/index.json"))
digest = next(m["digest"] for m in index["manifests"]
              if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref)
m = json.load(open(layout + "/blobs/sha256/" + digest.split(":")[1]))
print("%.1f" % ((m["config"]["size"] + sum(l["size"] for l in m["layers"])) / 1e6))
EOF
)
unpacked=$(du -sm "$rootfs" | cut -f1)
echo "image_test: $tag: compressed ${compressed} MB, unpacked ${unpacked} MB," \
  "container start to SERVING ${start_to_serving}s (router + 1 prefill + 1 decode, models/demo)"
echo PASS
