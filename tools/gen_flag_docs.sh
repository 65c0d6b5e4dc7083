#!/usr/bin/env bash
# Rebuilds the documented binaries and rewrites docs/flags/ from their --helpfull. Run it from
# anywhere in the repository after changing, adding or removing a flag; //tools:flag_docs_test
# fails until the pages match. Extra arguments go to `bazel build` (e.g. --config=opt).
set -euo pipefail
cd "$(dirname "$0")/.."
names=()
labels=()
while read -r name label; do
  names+=("$name")
  labels+=("$label")
done < <(python3 tools/gen_flag_docs.py --labels)
bazel build "$@" "${labels[@]}"
bin=$(bazel info "$@" bazel-bin 2>/dev/null)
args=()
for i in "${!labels[@]}"; do
  path=${labels[$i]#//}
  args+=("${names[$i]}=$bin/${path%%:*}/${path##*:}")
done
python3 tools/gen_flag_docs.py --out docs/flags "${args[@]}"
