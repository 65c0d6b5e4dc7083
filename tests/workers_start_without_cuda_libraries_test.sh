#!/usr/bin/env bash
# The worker binaries carry the CUDA backend but must start on machines without the CUDA
# toolkit's shared libraries (CPU serving, the local demo): none of them may be a load-time
# dependency (cuBLASLt is opened when --device=cuda first needs it; the CUDA runtime is static).
set -euo pipefail
status=0
for bin in "$@"; do
  needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  [ -n "$needed" ] || { echo "FAIL: $bin: readelf found no NEEDED entries"; status=1; continue; }
  bad=$(grep -E '^lib(cublas|cublasLt|cudart|cuda|nccl|cufft|curand|cusparse|nvrtc)\.so' <<<"$needed" || true)
  if [ -n "$bad" ]; then
    echo "FAIL: $bin needs CUDA libraries at load time:" $bad
    status=1
  else
    echo "ok: $bin ($(wc -l <<<"$needed") shared libraries, none from CUDA)"
  fi
done
exit $status
