#!/usr/bin/env bash
# Builds the deepinfer container image without a registry or a container daemon:
#
#   deploy/image/build_image.sh [--cuda] [--tag NAME:TAG] OUT_DIR
#
# 1. The optimised binaries (router, prefill_node, decode_node, vision_encoder, launcher, chat,
#    bench) with `bazel build --compilation_mode=opt` and no -march=native (the image runs on
#    other hosts; the CPU kernels pick their instruction set at run time).
# 2. The runtime packages, derived from the binaries: every shared library `ldd` resolves is mapped
#    to its Debian package with `dpkg -S` (libraries under /usr/local/cuda are CUDA's, not
#    Debian's: only the -cuda variant carries them).
# 3. A Debian bookworm root filesystem made by `debootstrap --variant=minbase` with those packages,
#    from the Debian mirror this machine's apt sources name; documentation (but each package's
#    copyright file), man pages, apt lists and caches, logs and the host's resolv.conf removed.
# 4. Layer 2: the binaries under /opt/deepinfer (symlinked into /usr/local/bin), user deepinfer
#    (uid/gid 65532, the manifests' runAsUser) and, with --cuda, the CUDA runtime libraries the
#    binaries load: those ldd resolves under /usr/local/cuda (e.g. NCCL) and libcublasLt, which
#    kernels/cuda/linear.cu dlopens (cudart is linked statically; the driver's libcuda comes from
#    the host through the NVIDIA container toolkit).
# 5. An OCI image layout OUT_DIR/oci (tag TAG) and a docker-archive OUT_DIR/deepinfer-TAG.tar
#    (`docker load`, `podman load`, `kind load image-archive`, `ctr images import`).
#
# Tools, all Debian packages (scripts/setup.sh does not install them; this script names what is
# missing): debootstrap; umoci, which builds the image: it works on a plain directory (unpack an
# image to a bundle, change the rootfs, repack the difference as a layer), with no daemon and no
# containers-storage (buildah needs one, with overlay or vfs mounts); skopeo only converts the
# finished OCI layout into the docker-archive format that `docker load` and kind read.
#
# Reproducibility: the tag is the git commit (deepinfer:<short sha>, -dirty for uncommitted
# changes, -cuda for the variant); the labels org.opencontainers.image.{version,revision,created}
# come from git; every file's mtime and the image's created time are SOURCE_DATE_EPOCH (default:
# the commit's time). The Debian package versions are whatever the mirror serves that day.
#
# Needs root (debootstrap, file ownership in the layers) and the Debian mirror over the network;
# takes a few minutes beyond the Bazel build. OUT_DIR/cache keeps debootstrap's downloads.
set -euo pipefail
cd "$(dirname "$0")/../.."

cuda=0
tag=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda=1 ;;
    --tag) tag="$2"; shift ;;
    --tag=*) tag="${1#--tag=}" ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    -*) echo "build_image: unknown option $1" >&2; exit 2 ;;
    *) out="$1" ;;
  esac
  shift
done
[ -n "$out" ] || { echo "usage: $0 [--cuda] [--tag NAME:TAG] OUT_DIR" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "build_image: needs root (debootstrap, layer ownership)" >&2; exit 1; }
for tool in debootstrap umoci skopeo dpkg ldd; do
  command -v "$tool" >/dev/null ||
    { echo "build_image: $tool missing: apt-get install debootstrap umoci skopeo" >&2; exit 1; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

# --- 1. Binaries -------------------------------------------------------------------------------
# target -> path under /opt/deepinfer (the launcher finds router/router etc. beside itself through
# launcher.runfiles/deepinfer, a link to /opt/deepinfer).
TARGETS=(
  //router:router=router/router
  //prefill_node:prefill_node=prefill_node/prefill_node
  //decode_node:decode_node=decode_node/decode_node
  //vision_encoder:vision_encoder=vision_encoder/vision_encoder
  //deploy/local:launcher=launcher
  //tools:chat=chat
  //tools/bench:bench=bench
)
labels=("${TARGETS[@]%%=*}")
nice -n 10 bazel build --compilation_mode=opt "${labels[@]}"
bin_root=$(bazel info --compilation_mode=opt bazel-bin 2>/dev/null)

stage="$out/stage"
rm -rf "$stage"
mkdir -p "$stage/opt/deepinfer" "$stage/usr/local/bin"
for t in "${TARGETS[@]}"; do
  label=${t%%=*} dest=${t#*=}
  pkg=${label#//}; pkg=${pkg%%:*}; name=${label##*:}
  mkdir -p "$stage/opt/deepinfer/$(dirname "$dest")"
  install -m 0755 "$bin_root/$pkg/$name" "$stage/opt/deepinfer/$dest"
  ln -s "/opt/deepinfer/$dest" "$stage/usr/local/bin/$(basename "$dest")"
done
mkdir -p "$stage/opt/deepinfer/launcher.runfiles"
ln -s .. "$stage/opt/deepinfer/launcher.runfiles/deepinfer"

# --- 2. Runtime packages from the shared-library dependencies ---------------------------------
# dpkg records a file under the path its package ships it at; with merged /usr, ldd's
# /lib/x86_64-linux-gnu/... may be recorded as /usr/lib/... or the other way round.
owner() {
  local p found
  for p in "$1" "$(readlink -f "$1")" "/usr${1}" "${1#/usr}"; do
    found=$(dpkg -S "$p" 2>/dev/null | head -n1 | cut -d: -f1)
    [ -n "$found" ] && { echo "$found"; return 0; }
  done
  return 1
}
declare -A packages=()
cuda_libs=()
while read -r lib; do
  case "$lib" in
    /usr/local/cuda*|*/cuda/*) cuda_libs+=("$lib"); continue ;;
  esac
  pkg=$(owner "$lib") || { echo "build_image: no Debian package owns $lib" >&2; exit 1; }
  packages[$pkg]=1
done < <(for f in "$stage"/opt/deepinfer/*/* "$stage"/opt/deepinfer/{launcher,chat,bench}; do
           [ -f "$f" ] && [ ! -L "$f" ] && ldd "$f" | awk '/=> \//{print $3}'
         done | sort -u)
pkg_list=$(printf '%s\n' "${!packages[@]}" | sort | paste -sd, -)
echo "build_image: runtime packages: $pkg_list"
echo "$pkg_list" | tr , '\n' > "$out/packages.txt"

# --- 3. Root filesystem ------------------------------------------------------------------------
# The mirror the machine's apt sources use for bookworm (deb822 .sources or one-line lists).
mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
           awk '/^URIs:/{u=$2} /^Suites:/ && / bookworm( |$)/{print u; exit}')
[ -n "$mirror" ] || mirror=$(grep -hE '^deb +[^ ]+ +bookworm +' /etc/apt/sources.list \
                               /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2; exit}')
mirror=${mirror:-http://deb.debian.org/debian}
echo "build_image: debootstrap from $mirror"

commit=$(git rev-parse HEAD)
short=$(git rev-parse --short=12 HEAD)
dirty=""
git diff --quiet HEAD -- . 2>/dev/null || dirty="-dirty"
version=$(git describe --tags --always --dirty 2>/dev/null || echo "$short$dirty")
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
suffix=""
[ "$cuda" = 1 ] && suffix="-cuda"
[ -n "$tag" ] || tag="deepinfer:$short$dirty$suffix"
ref=${tag##*:}

layout="$out/oci"
bundle="$out/bundle"
rm -rf "$layout" "$bundle"
umoci init --layout "$layout"
umoci new --image "$layout:$ref"
umoci unpack --image "$layout:$ref" "$bundle"
rootfs="$bundle/rootfs"
mkdir -p "$out/cache/debootstrap"
nice -n 10 debootstrap --variant=minbase --include="$pkg_list" \
  --cache-dir="$out/cache/debootstrap" bookworm "$rootfs" "$mirror" >"$out/debootstrap.log" 2>&1 ||
  { tail -20 "$out/debootstrap.log" >&2; echo "build_image: debootstrap failed" >&2; exit 1; }

# Nothing of the build host and no caches: apt lists and archives, debconf backups, logs, docs
# (each package's copyright file stays: the licences the binaries ship under), man/info pages,
# translations, the host's DNS configuration (the runtime provides one).
find "$rootfs/var/lib/apt/lists" "$rootfs/var/cache/apt" "$rootfs/var/log" -type f -delete
rm -f "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old
find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$rootfs"/usr/share/{man,info,lintian,linda}/* "$rootfs"/usr/share/locale/*
: > "$rootfs/etc/resolv.conf"
: > "$rootfs/etc/hostname"
rm -f "$rootfs/etc/machine-id"
find "$rootfs" -xdev -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
# --refresh-bundle: the next repack's layer then holds only what changes after this one.
umoci repack --refresh-bundle --image "$layout:$ref" --history.created "$created" \
  --history.created_by "debootstrap --variant=minbase bookworm $mirror" \
  --history.comment "Debian bookworm minbase + runtime packages: $pkg_list" "$bundle"

# --- 4. deepinfer layer -------------------------------------------------------------------------
cp -a "$stage/." "$rootfs/"
echo "deepinfer:x:65532:65532:deepinfer:/var/lib/deepinfer:/usr/sbin/nologin" \
  >> "$rootfs/etc/passwd"
echo "deepinfer:x:65532:" >> "$rootfs/etc/group"
echo "deepinfer:*:19000:0:99999:7:::" >> "$rootfs/etc/shadow"
install -d -o 65532 -g 65532 -m 0750 "$rootfs/var/lib/deepinfer"
if [ "$cuda" = 1 ]; then
  cuda_home=${CUDA_HOME:-/usr/local/cuda}
  # The binaries' run path is /usr/local/cuda/lib64 (third_party/BUILD.bazel): same place here.
  mkdir -p "$rootfs/usr/local/cuda/lib64"
  # libcublasLt is dlopened (libcublasLt.so.<major>), so ldd cannot see it: named here.
  for lib in "${cuda_libs[@]}" "$cuda_home"/lib64/libcublasLt.so.[0-9]*; do
    # The file under its soname, as the loader asks for it.
    soname=$(objdump -p "$lib" 2>/dev/null | awk '/SONAME/{print $2}')
    soname=${soname:-$(basename "$lib")}
    [ -e "$rootfs/usr/local/cuda/lib64/$soname" ] && continue
    cp -L "$lib" "$rootfs/usr/local/cuda/lib64/$soname"
    # Its licence: the toolkit's EULA, or (a toolkit assembled from NVIDIA's wheels) the licence
    # of the wheel it came from (libcublasLt -> nvidia_cublas-*, libnccl -> nvidia_nccl_*).
    component=$(echo "$soname" | sed -E 's/^lib//; s/\.so.*//; s/Lt$//' | tr 'A-Z' 'a-z')
    for lic in "$cuda_home"/dist-info/nvidia_"$component"[-_]*/licenses; do
      [ -d "$lic" ] || continue
      dest="$rootfs/usr/local/cuda/licenses/$(basename "$(dirname "$lic")")"
      mkdir -p "$dest" && cp -r "$lic/." "$dest/"
    done
  done
  [ -f "$cuda_home/EULA.txt" ] && cp "$cuda_home/EULA.txt" "$rootfs/usr/local/cuda/EULA.txt"
  echo /usr/local/cuda/lib64 > "$rootfs/etc/ld.so.conf.d/deepinfer-cuda.conf"
  ldconfig -r "$rootfs"
fi
find "$rootfs" -xdev -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
umoci repack --image "$layout:$ref" --history.created "$created" \
  --history.created_by "deploy/image/build_image.sh$([ "$cuda" = 1 ] && echo " --cuda")" \
  --history.comment "deepinfer $version ($commit)" "$bundle"

# --- 5. Image configuration, docker-archive ----------------------------------------------------
# Default command: the whole cluster in one container (router + 1 prefill + 1 decode) on the
# model mounted at /models/model; the manifests run each binary on its own with `command:`.
kind=CPU
[ "$cuda" = 1 ] && kind=CUDA
cfg=(
  --config.user 65532:65532
  --config.workingdir /var/lib/deepinfer
  --config.env PATH=/usr/local/bin:/usr/bin:/bin
  --config.exposedports 50051/tcp
  --config.cmd /usr/local/bin/launcher
  --config.cmd --model=/models/model
  --config.cmd --router_listen=0.0.0.0:50051
  --config.cmd --router_flags=--allow_anonymous
  --config.label "org.opencontainers.image.title=deepinfer$suffix"
  --config.label "org.opencontainers.image.description=deepinfer LLM serving ($kind)"
  --config.label "org.opencontainers.image.version=$version"
  --config.label "org.opencontainers.image.revision=$commit"
  --config.label "org.opencontainers.image.created=$created"
  --config.label "org.opencontainers.image.base.name=debian:bookworm (debootstrap minbase)"
  --config.volume /models
  --created "$created" --os linux --architecture amd64
)
if [ "$cuda" = 1 ]; then
  cfg+=(--config.env NVIDIA_VISIBLE_DEVICES=all
        --config.env NVIDIA_DRIVER_CAPABILITIES=compute,utility)
fi
umoci config --image "$layout:$ref" --history.created "$created" "${cfg[@]}" \
  --manifest.annotation "org.opencontainers.image.version=$version" \
  --manifest.annotation "org.opencontainers.image.revision=$commit" \
  --manifest.annotation "org.opencontainers.image.created=$created"
umoci gc --layout "$layout"
rm -rf "$bundle" "$stage"

archive="$out/deepinfer-$ref.tar"
rm -f "$archive"
skopeo copy --quiet "oci:$layout:$ref" "docker-archive:$archive:$tag"

# Compressed size: the gzipped layers plus the config, as a registry stores and a pull moves them.
compressed=$(python3 - "$layout" "$ref" <<'EOF'
import json, sys
layout, ref = sys.argv[1], sys.argv[2]
index = json.load(open(layout + "/index.json"))
digest = next(m["digest"] for m in index["manifests"]
              if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref)
m = json.load(open(layout + "/blobs/sha256/" + digest.split(":")[1]))
print(m["config"]["size"] + sum(layer["size"] for layer in m["layers"]))
EOF
)
echo "$tag" > "$out/TAG"
awk -v t="$tag" -v c="$compressed" -v a="$(stat -c %s "$archive")" -v f="$archive" 'BEGIN {
  printf "build_image: %s: compressed %.1f MB (layers + config), docker-archive %.1f MB (%s)\n",
         t, c / 1e6, a / 1e6, f }'
echo "build_image: OCI layout $layout (ref $ref)"
