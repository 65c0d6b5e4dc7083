#!/usr/bin/env bash
# code_stats.py on a hand-made fixture (tools/testdata/code_stats/*.in, copied under their real
# names into a scratch tree): function lengths counted by hand, braces in strings, comments,
# enums, initializers and an initializer list's `member_{x}` ignored, flags in a comment or a
# string not counted, flags attributed to the binary through its BUILD dependency, and the
# check mode's exit status.
set -euo pipefail
tool=$1
fixtures=$(dirname "$2")
tree=${TEST_TMPDIR:-$(mktemp -d)}/code_stats_tree
mkdir -p "$tree/pkg"
cp "$fixtures/fixture.cc.in" "$tree/pkg/fixture.cc"
cp "$fixtures/flags.cc.in" "$tree/pkg/flags.cc"
cp "$fixtures/BUILD.in" "$tree/pkg/BUILD.bazel"
printf 'line 1\nline 2\nline 3\n' > "$tree/README.md"

fail() { echo "FAIL: $*"; echo "$out"; exit 1; }
out=$(python3 "$tool" --root "$tree")
functions=$(echo "$out" | sed -n '/^== largest functions/,/^$/p')
want='lines  function        file:line
    7  Seven           pkg/fixture.cc:10
    7  Twice           pkg/fixture.cc:37
    5  Widget::Widget  pkg/fixture.cc:27
    3  Inline          pkg/fixture.cc:21'
[ "$(echo "$functions" | sed -n '2,6p')" = "$want" ] || fail "functions: $functions"
echo "$out" | grep -qE '^README.md lines +3$' || fail "README line count"
echo "$out" | grep -qE '^flags //pkg:tool +2$' || fail "flags per binary"
echo "$out" | grep -qE '^ +2  pkg/flags.cc$' || fail "flags per file"
echo "$out" | grep -qE '^largest file \(lines\) +45$' || fail "largest file"

# Check mode: 7 > 6 fails naming both 7-line functions; 7 passes.
if out=$(python3 "$tool" --root "$tree" --max-function-lines 6 --paths pkg); then
  fail "--max-function-lines 6 passed"
fi
echo "$out" | grep -q 'Seven' || fail "check mode does not name Seven"
echo "$out" | grep -q 'Twice' || fail "check mode does not name Twice"
out=$(python3 "$tool" --root "$tree" --max-function-lines 7 --paths pkg/fixture.cc) ||
  fail "--max-function-lines 7 failed"

# --before: the summary as a before / after table.
python3 "$tool" --root "$tree" > "$tree/before.txt"
printf 'line 4\n' >> "$tree/README.md"
out=$(python3 "$tool" --root "$tree" --before "$tree/before.txt")
echo "$out" | grep -qE '^README.md lines +3 +4 +\+1$' || fail "--before"
echo PASS
