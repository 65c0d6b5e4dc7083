#!/usr/bin/env bash
# Builds the gpu-tagged test binaries here (no GPU needed) and copies them, with the shared
# libraries they need that a bare CUDA machine may lack (Abseil etc.) and the data files their
# runfiles hold (models, fixtures: OUT_DIR/data, the tests' working directory there), into
# OUT_DIR for run_gpu_checks.sh. Usage: tools/gpu/pack_gpu_tests.sh OUT_DIR   (from the workspace
# root)
set -euo pipefail
out="${1:?usage: $0 OUT_DIR}"
# .bazelrc has no --config=cuda: nvcc runs through cuda_library whenever the targets are built.
targets=$(bazel query 'attr(tags, "\bgpu\b", tests(//kernels/cuda/... + //engine/cuda/...))' 2>/dev/null)
[ -n "$targets" ] || { echo "no gpu-tagged tests found" >&2; exit 1; }
# GPU benchmarks: gpu-tagged binaries that are not tests; run after the tests, into the report.
benches=$(bazel query 'attr(tags, "\bgpu\b", kind("cc_binary", //kernels/cuda/... + //engine/cuda/...))' 2>/dev/null | tr '\n' ' ')
# Optimised host code (the benchmarks time host-side launches too), but no -march=native: the GPU
# machine's processor is not this one (the CPU kernels pick their instruction set at run time).
bazel build --compilation_mode=opt $targets $benches
mkdir -p "$out/bin" "$out/bench" "$out/lib" "$out/data"
for t in $targets $benches; do
  name="${t##*:}"
  pkg="${t#//}"; pkg="${pkg%%:*}"
  case " $benches " in
    *" $t "*) cp -f "bazel-bin/$pkg/$name" "$out/bench/$name" ;;
    *) cp -f "bazel-bin/$pkg/$name" "$out/bin/$name" ;;
  esac
  # Data files from the runfiles tree (not the binaries or their shared libraries), at their
  # workspace-relative paths: the tests open them relative to the working directory.
  runfiles="bazel-bin/$pkg/$name.runfiles/deepinfer"
  if [ -d "$runfiles" ]; then
    (cd "$runfiles" && find -L . -type f ! -path '*/_solib*' ! -name '*.so*' -print0) |
      while IFS= read -r -d '' f; do
        [ "$(head -c 4 "$runfiles/$f" | od -An -c | tr -d ' ')" = "177ELF" ] && continue
        mkdir -p "$out/data/$(dirname "$f")"
        cp -fL "$runfiles/$f" "$out/data/$f"
      done
  fi
  ldd "bazel-bin/$pkg/$name" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libstdc++.so*|libgcc_s.so*|ld-linux*) ;;
      libcuda.so*) ;;  # the driver's, never copied
      # cuBLAS(Lt) is hundreds of MB: taken from the GPU machine's CUDA 13 (the toolkit's lib64
      # or the nvidia-cublas wheel; run_gpu_checks.sh puts both on LD_LIBRARY_PATH).
      libcublas.so*|libcublasLt.so*) ;;
      *) cp -fL "$lib" "$out/lib/" ;;
    esac
  done
done
cp -f tools/gpu/run_gpu_checks.sh "$out/"
git rev-parse HEAD > "$out/COMMIT" 2>/dev/null || true
echo "packed $(ls "$out/bin" | wc -l) test and $(ls "$out/bench" | wc -l) benchmark binaries and $(find "$out/data" -type f | wc -l) data files ($(du -sh "$out/data" | cut -f1)) into $out"
