#!/usr/bin/env bash
# docs/flags/ equals what the binaries print: regenerates every page from the binaries given as
# NAME=PATH (data deps) and diffs against the committed pages; on a difference it prints the diff
# and the command that regenerates them (tools/gen_flag_docs.sh).
set -euo pipefail
tool=$1
docs=$(dirname "$2")
shift 2
python3 "$tool" --check "$docs" "$@"
