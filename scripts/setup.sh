#!/usr/bin/env bash
# Installs exactly the Debian packages that building and testing deepinfer needs. Idempotent and
# fast when everything is present (one dpkg-query); fails loudly, naming what is missing, when it
# cannot install. The CUDA 13 toolkit is not a Debian package: it must already be under
# /usr/local/cuda (or $CUDA_HOME), and its absence is reported by name.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # Bazel 4.2.3, used offline
  g++                      # C++20 compiler
  pkg-config
  protobuf-compiler        # protoc
  protobuf-compiler-grpc   # grpc_cpp_plugin
  libprotobuf-dev
  libgrpc++-dev
  libabsl-dev
  libspdlog-dev
  libfmt-dev
  libucx-dev
  ucx-utils                # ucx_info / ucx_perftest for transport checks
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libpcre2-dev
  nlohmann-json3-dev
  libcurl4-openssl-dev     # router's Kubernetes scaler (scale subresource over HTTPS)
  libpng-dev               # PNG decoding of request images (vision models)
  libturbojpeg0-dev        # JPEG decoding of request images (vision models)
  libssl-dev               # libcrypto: SHA-256 of image bytes (common/sha256); libssl: TLS on the router's listeners
  zlib1g-dev               # CRC-32 of KV store objects (kv_store)
  python3-yaml             # deploy/k8s manifest validation
  python3-jsonschema
  libboost-dev             # Boost.Beast/Asio: the router's HTTP API (header-only)
  python3-pip              # installs the openai client below
)

missing_packages() {
  local missing=()
  for pkg in "${PACKAGES[@]}"; do
    pkg=${pkg%%#*}
    [ -z "$pkg" ] && continue
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  echo "${missing[@]:-}"
}

missing=$(missing_packages)
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages: $missing"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: $missing" >&2; exit 1; }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >/dev/null || echo "setup: apt-get update failed; trying the cached lists" >&2
  # shellcheck disable=SC2086
  if ! $SUDO apt-get install -y -q --no-install-recommends $missing >/tmp/deepinfer-apt.log 2>&1; then
    tail -20 /tmp/deepinfer-apt.log >&2
    echo "setup: apt-get install failed for: $missing" >&2
    exit 1
  fi
  still=$(missing_packages)
  if [ -n "$still" ]; then
    echo "setup: still missing after install: $still" >&2
    exit 1
  fi
fi

# kubectl renders the Kubernetes overlays (`kubectl kustomize`, //deploy/k8s:manifests_test). The
# base uses kustomize v4+ fields, which Debian's kubernetes-client (1.20, kustomize v2.0.3) cannot
# render; the `kubectl` package of the Kubernetes/Google Cloud apt repository can. Installed by that
# name when no kubectl is on PATH; without one only that test fails, naming why.
if ! command -v kubectl >/dev/null; then
  echo "setup: installing kubectl"
  SUDO=""
  [ "$(id -u)" != 0 ] && command -v sudo >/dev/null && SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends kubectl \
    >/tmp/deepinfer-apt.log 2>&1 ||
    echo "setup: no kubectl package in the apt sources: //deploy/k8s:manifests_test needs a" \
      "kubectl (1.21 or later) on PATH" >&2
fi

# The official OpenAI Python client, pinned: tests/openai_http_test drives the router's HTTP API
# with it through Debian's /usr/bin/python3 (not a Debian package; PyPI by name).
OPENAI_VERSION=1.109.1
if ! /usr/bin/python3 -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" \
    2>/dev/null; then
  echo "setup: installing openai==$OPENAI_VERSION for /usr/bin/python3 (pip)"
  PIP_SUDO=""
  [ "$(id -u)" != 0 ] && PIP_SUDO=sudo
  if ! $PIP_SUDO /usr/bin/python3 -m pip install -q --break-system-packages \
      "openai==$OPENAI_VERSION" >/tmp/deepinfer-pip.log 2>&1; then
    tail -20 /tmp/deepinfer-pip.log >&2
    echo "setup: pip install openai==$OPENAI_VERSION failed" >&2
    exit 1
  fi
fi

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
for f in bin/nvcc lib64/libcudart_static.a lib64/libcublas.so lib64/libnccl.so include/cuda_runtime.h; do
  if [ ! -e "$CUDA_HOME/$f" ]; then
    echo "setup: missing $CUDA_HOME/$f: install the CUDA 13 toolkit (with cuBLAS and NCCL) there" >&2
    exit 1
  fi
done

for tool in bazel protoc grpc_cpp_plugin; do
  command -v "$tool" >/dev/null || { echo "setup: $tool not on PATH after install" >&2; exit 1; }
done
echo "setup: all build dependencies present"
