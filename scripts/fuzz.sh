#!/usr/bin/env bash
# Coverage-guided fuzzing of one fuzz target with libFuzzer + AddressSanitizer (clang).
# CI runs the same targets briefly with a mutation driver (//common:fuzz_main) instead.
#
#   scripts/fuzz.sh //engine:safetensors_fuzz_test [seconds]
#
# New interesting inputs go to a scratch corpus under /tmp; crashes are written to the current
# directory as crash-*.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh //pkg:name_fuzz_test [seconds]}
seconds=${2:-60}
for pkg in clang libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || {
    echo "fuzz: installing $pkg"; apt-get install -y -q "$pkg" >/dev/null; }
done
bazel build --config=libfuzzer "$target"
bin="bazel-bin/${target#//}"
bin="${bin/://}"
scratch=$(mktemp -d /tmp/fuzz-corpus.XXXXXX)
# The seed corpus is the directory named in the target's args (the last one).
seeds=$(bazel query --output=build "$target" 2>/dev/null | grep -oE '"[^"]*fuzz_corpus[^"]*"' | tail -1 | tr -d '"')
echo "fuzz: $bin for ${seconds}s, seeds ${seeds:-none}, corpus $scratch"
"$bin" -max_total_time="$seconds" -print_final_stats=1 "$scratch" ${seeds:+"$seeds"}
