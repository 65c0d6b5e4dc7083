#!/usr/bin/env python3
"""Code-size figures for deepinfer: largest C++ functions and files, flags per binary, README size.

    tools/code_stats.py                      # every report, from the repository root
    tools/code_stats.py engine/ node/        # function and file tables restricted to these paths
    tools/code_stats.py --top 40             # longer tables (default 20)
    tools/code_stats.py --bazel-bin bazel-bin   # flag counts from the built binaries' --helpfull
    tools/code_stats.py --before old.txt     # the summary as a before / after / change table
    tools/code_stats.py --max-function-lines 150 --paths engine/llm_engine.cc engine/speculative
        # check mode: exit 1 naming every function in those paths longer than 150 lines

Functions are found by a brace-matching heuristic over the source with comments, string and
character literals and preprocessor lines blanked out: a `{` at namespace or class scope whose
head (the text since the previous `;`, `{` or `}`) has a parenthesised parameter list and is not
a class, enum, namespace or initializer opens a function; its length is the lines from the head's
first line to the closing `}`. Lambdas and blocks inside a function count towards that function.

The summary also counts the serving core (SERVING_CORE: engine/llm_engine*, the speculative
component) on its own.

Flags: each `ABSL_FLAG(` definition counts for its file and for every cc_binary whose sources or
in-repository dependencies (read from the BUILD files) include that file. With --bazel-bin the
binaries' own `--helpfull` output is counted instead (flags listed under the project's files).

The summary section's lines are `metric<two or more spaces>value`; --before reads them back from
an earlier output.
"""

import argparse
import builtins
import glob as globlib
import os
import re
import subprocess
import sys

CPP_EXTENSIONS = (".cc", ".h", ".cu", ".cuh", ".cpp", ".hpp")
SKIP_DIRS = {".git", "node_modules", "__pycache__"}
# Non-function scopes: their bodies are searched for functions (namespace, class) or skipped.
SCOPE_KEYWORDS = re.compile(r"\b(namespace|class|struct|union|extern)\b")
SKIP_KEYWORDS = re.compile(r"\b(enum)\b")
# The serving core, for the summary's own rows (issue 58's goal: no function over 150 lines there):
# the engine class and the speculative-decoding component under either of its names, tests left
# out.
SERVING_CORE = ("engine/llm_engine", "engine/spec/", "engine/speculative/")
CONTROL_KEYWORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype",
                    "alignof", "static_assert", "do", "else", "try"}


# --------------------------------------------------------------------------------------------
# C++ source scanning


def blank_comments_and_strings(text):
    """Returns `text` with comments, string/char literals and preprocessor lines replaced by
    spaces (newlines kept, so offsets and line numbers stay the same)."""
    out = list(text)
    n = len(text)
    i = 0
    at_line_start = True

    def blank(begin, end):
        for k in range(begin, end):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if at_line_start and c in " \t":
            i += 1
            continue
        if at_line_start and c == "#":
            # A preprocessor directive, with backslash continuations.
            j = i
            while j < n:
                if text[j] == "\n" and text[j - 1] != "\\":
                    break
                j += 1
            blank(i, j)
            i = j
            continue
        at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or
                                                                     text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delimiter = text[i + 2:open_paren] if open_paren >= 0 else ""
            end = text.find(")" + delimiter + '"', open_paren + 1) if open_paren >= 0 else -1
            j = n if end < 0 else end + len(delimiter) + 2
            blank(i, j)
            i = j
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):
            # A ' after an alphanumeric is a digit separator (1'000), not a character literal.
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            blank(i, j)
            i = j
        else:
            i += 1
    return "".join(out)


def function_name(head):
    """The name before the head's first top-level parameter list, or None when the head does
    not look like a function (no parameter list, a control statement, an initializer)."""
    depth_angle = 0
    for m in re.finditer(r"[()<>=]", head):
        ch = m.group()
        if ch == "<":
            depth_angle += 1
        elif ch == ">":
            depth_angle = max(0, depth_angle - 1)
        elif ch == "=" and depth_angle == 0:
            before = head[:m.start()].rstrip()
            # operator==, operator=, operator<= ... are names; any other `=` is an initializer.
            if not re.search(r"operator\s*\S*$", before):
                return None
        elif ch == "(" and depth_angle == 0:
            before = head[:m.start()].rstrip()
            name = re.search(r"((?:[A-Za-z_~][\w]*\s*(?:<[^()]*>)?\s*::\s*)*"
                             r"(?:operator\s*(?:\(\)|[^\s(]+)|~?[A-Za-z_]\w*))$", before)
            if not name:
                return None
            text = re.sub(r"\s+", "", name.group(1))
            if text.split("::")[-1] in CONTROL_KEYWORDS:
                return None
            if text.startswith("TEST") or text.isupper():
                # TEST_F(Suite, Name) and other macro-defined functions: keep the arguments.
                close = head.find(")", m.start())
                args = re.sub(r"\s+", " ", head[m.start() + 1:close]).strip()
                return "%s(%s)" % (text, args)
            return text
    return None


def matching_brace(code, i):
    """The offset just past the `}` that closes the `{` at `i` (or the end of `code`)."""
    depth, j = 0, i
    while j < len(code):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return j


def stack_skips(stack):
    return "skip" in stack


def find_functions(text):
    """Yields (name, first_line, last_line) for every function defined in `text` (C++)."""
    code = blank_comments_and_strings(text)
    line_starts = [0]
    for k, ch in enumerate(code):
        if ch == "\n":
            line_starts.append(k + 1)

    def line_of(offset):
        lo, hi = 0, len(line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    results = []
    # Stack of open braces at scope level: "scope" (namespace/class: search inside) or "skip".
    stack = []
    head_start = 0
    i = 0
    n = len(code)
    while i < n:
        ch = code[i]
        if ch == ";":
            head_start = i + 1
        elif ch == "}":
            if stack:
                stack.pop()
            head_start = i + 1
        elif ch == "{":
            head = code[head_start:i]
            if not stack_skips(stack) and (
                    head.count("(") > head.count(")") or
                    (re.search(r"\)\s*:(?!:)", head) and re.search(r"[\w>]\s*$", head))):
                # A braced initializer inside a head (`f({1, 2})`, `: member_{x}`): part of it.
                i = matching_brace(code, i)
                continue
            kind = "skip"
            name = None
            if not stack_skips(stack):
                bare = re.sub(r"\btemplate\s*<[^{;]*?>\s*(?=[A-Za-z_])", "", head)
                bare = re.sub(r"\b__\w+__\s*\([^()]*\)", "", bare)  # __launch_bounds__(256)
                if SKIP_KEYWORDS.search(bare):
                    kind = "skip"
                elif SCOPE_KEYWORDS.search(bare) and "(" not in bare:
                    kind = "scope"  # namespace a {, class X : public Y {, extern "C" {
                else:
                    name = function_name(bare)
                    kind = "function" if name else "skip"
            if kind == "function":
                j = matching_brace(code, i)
                stripped = len(head) - len(head.lstrip())
                first = line_of(head_start + stripped)
                last = line_of(j - 1)
                results.append((name, first, last))
                i = j
                head_start = j
                continue
            stack.append(kind)
            head_start = i + 1
        elif ch == ":" and i + 1 < n and code[i + 1] != ":" and (i == 0 or code[i - 1] != ":"):
            # `public:` / `private:` / `case X:` end a head; an initializer list's `:` follows a
            # `)` and does not.
            before = code[head_start:i].strip()
            if re.fullmatch(r"(public|private|protected)", before):
                head_start = i + 1
        i += 1
    return results


def cpp_files(root, paths):
    """Repository-relative paths of the C++ sources under `paths` (default: the whole tree)."""
    found = []
    for path in paths or ["."]:
        full = os.path.join(root, path)
        if os.path.isfile(full):
            if full.endswith(CPP_EXTENSIONS):
                found.append(os.path.relpath(full, root))
            continue
        for dirpath, dirnames, filenames in os.walk(full):
            dirnames[:] = sorted(d for d in dirnames
                                 if d not in SKIP_DIRS and not d.startswith("bazel-"))
            for f in sorted(filenames):
                if f.endswith(CPP_EXTENSIONS):
                    found.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(set(found))


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


# --------------------------------------------------------------------------------------------
# BUILD files: which sources each cc_binary is made of


def _build_globals(source, package, root, sink):
    """Globals for exec'ing a BUILD file: every called name that is not a Python builtin is a
    rule that records its kwargs (predefined, so comprehensions see them too)."""

    def make_rule(kind):
        def rule(*_, **kwargs):
            if "name" in kwargs:
                sink.append((kind, package, kwargs))
        return rule

    def glob(include, exclude=(), **_):
        base = os.path.join(root, package)
        out = []
        for pattern in include:
            for match in globlib.glob(os.path.join(base, pattern), recursive=True):
                rel = os.path.relpath(match, base)
                if rel not in exclude and os.path.isfile(match):
                    out.append(rel)
        return sorted(out)

    env = {"__builtins__": builtins}
    for name in set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", source)):
        if not hasattr(builtins, name):
            env[name] = make_rule(name)
    for name in ("load", "package", "licenses", "exports_files"):
        env[name] = lambda *a, **k: None
    env["select"] = lambda d, **k: d.get("//conditions:default", next(iter(d.values())))
    env["glob"] = glob
    return env


def read_build_graph(root):
    """Returns (binaries, rules): binaries is a list of labels of cc_binary rules; rules maps a
    label to (sources as repository paths, dependency labels)."""
    rules = {}
    binaries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and not d.startswith("bazel-"))
        build = next((f for f in ("BUILD.bazel", "BUILD") if f in filenames), None)
        if build is None:
            continue
        package = os.path.relpath(dirpath, root)
        package = "" if package == "." else package
        sink = []
        source = read(os.path.join(dirpath, build))
        try:
            exec(compile(source, build, "exec"), _build_globals(source, package, root, sink))
        except Exception as e:  # A BUILD file this reader cannot evaluate: its rules are unknown.
            print("code_stats: skipped %s/%s: %s" % (package, build, e), file=sys.stderr)
            continue
        for kind, pkg, kwargs in sink:
            label = "//%s:%s" % (pkg, kwargs["name"])
            srcs = []
            for attr in ("srcs", "hdrs", "textual_hdrs"):
                for s in kwargs.get(attr, []) or []:
                    if isinstance(s, str) and not s.startswith(("//", "@", ":")):
                        srcs.append(os.path.normpath(os.path.join(pkg, s)))
            deps = []
            for d in kwargs.get("deps", []) or []:
                if not isinstance(d, str) or d.startswith("@"):
                    continue
                if d.startswith(":"):
                    d = "//%s%s" % (pkg, d)
                elif d.startswith("//") and ":" not in d:
                    d = "%s:%s" % (d, d.rsplit("/", 1)[-1])
                deps.append(d)
            rules[label] = (srcs, deps)
            if kind == "cc_binary":
                binaries.append(label)
    return binaries, rules


def binary_sources(label, rules):
    seen, todo, sources = set(), [label], set()
    while todo:
        current = todo.pop()
        if current in seen or current not in rules:
            continue
        seen.add(current)
        srcs, deps = rules[current]
        sources.update(srcs)
        todo.extend(deps)
    return sources


FLAG_RE = re.compile(r"\bABSL_FLAG\s*\(")


def flags_by_file(root):
    counts = {}
    for path in cpp_files(root, None):
        code = blank_comments_and_strings(read(os.path.join(root, path)))
        k = len(FLAG_RE.findall(code))
        if k:
            counts[path] = k
    return counts


def flags_from_helpfull(bazel_bin, binaries, project_dirs):
    """Runs every built binary with --helpfull; counts the flags listed under project files."""
    counts = {}
    for label in binaries:
        package, name = label[2:].split(":")
        exe = os.path.join(bazel_bin, package, name)
        if not os.access(exe, os.X_OK):
            continue
        try:
            out = subprocess.run([exe, "--helpfull"], capture_output=True, text=True,
                                 timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        count, mine = 0, False
        for line in out.splitlines():
            m = re.match(r"\s*Flags from (\S+):", line)
            if m:
                mine = m.group(1).split("/")[0] in project_dirs
            elif mine and re.match(r"    --\w", line):  # continuation lines: 6 spaces
                count += 1
        counts[label] = count
    return counts


# --------------------------------------------------------------------------------------------
# Reports


def table(rows, headers):
    widths = [max(len(str(r[k])) for r in rows + [headers]) for k in range(len(headers))]
    lines = []
    for r in [headers] + rows:
        cells = []
        for k, cell in enumerate(r):
            s = str(cell)
            cells.append(s.rjust(widths[k]) if isinstance(cell, (int, float)) else
                         s.ljust(widths[k]))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def read_summary(path):
    summary, inside = {}, False
    for line in read(path).splitlines():
        if line.startswith("== "):
            inside = line.startswith("== summary")
            continue
        if inside and line.strip() and not line.startswith("metric "):
            parts = re.split(r"\s{2,}", line.strip())
            if len(parts) >= 2:
                summary[parts[0]] = parts[-1]
    return summary


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="restrict the function and file tables")
    parser.add_argument("--root", default=None, help="repository root (default: this tool's ..)")
    parser.add_argument("--top", type=int, default=20, help="rows per table (default 20)")
    parser.add_argument("--long", type=int, default=150,
                        help="summary counts functions longer than this (default 150)")
    parser.add_argument("--bazel-bin", default=None,
                        help="count flags from the built binaries' --helpfull under this dir")
    parser.add_argument("--before", default=None,
                        help="an earlier output of this tool: print its summary beside this one")
    parser.add_argument("--max-function-lines", type=int, default=None,
                        help="check mode: exit 1 when a function in --paths is longer")
    parser.add_argument("--paths", dest="check_paths", nargs="+", default=None,
                        help="the paths check mode looks at (default: the positional paths)")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root or os.path.join(os.path.dirname(__file__), ".."))

    if args.max_function_lines is not None:
        paths = args.check_paths or args.paths
        if not paths:
            parser.error("--max-function-lines needs --paths")
        missing = [p for p in paths if not os.path.exists(os.path.join(root, p))]
        if missing:
            print("code_stats: no such path: %s" % ", ".join(missing), file=sys.stderr)
            return 2
        over = []
        for path in cpp_files(root, paths):
            for name, first, last in find_functions(read(os.path.join(root, path))):
                if last - first + 1 > args.max_function_lines:
                    over.append((last - first + 1, name, "%s:%d" % (path, first)))
        if over:
            over.sort(reverse=True)
            print("functions over %d lines:" % args.max_function_lines)
            print(table([[n, name, where] for n, name, where in over],
                        ["lines", "function", "file:line"]))
            return 1
        print("no function over %d lines in %s" % (args.max_function_lines, " ".join(paths)))
        return 0

    files = cpp_files(root, args.paths)
    functions, file_lines = [], []
    for path in files:
        text = read(os.path.join(root, path))
        file_lines.append((text.count("\n"), path))
        for name, first, last in find_functions(text):
            functions.append((last - first + 1, name, path, first))
    functions.sort(key=lambda f: (-f[0], f[2], f[3]))
    file_lines.sort(key=lambda f: (-f[0], f[1]))

    binaries, rules = read_build_graph(root)
    per_file = flags_by_file(root)
    if args.bazel_bin:
        project_dirs = {d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))}
        per_binary = flags_from_helpfull(args.bazel_bin, binaries, project_dirs)
        flag_source = "--helpfull of the binaries under %s" % args.bazel_bin
    else:
        per_binary = {}
        for label in binaries:
            sources = binary_sources(label, rules)
            count = sum(k for f, k in per_file.items() if f in sources)
            if count:
                per_binary[label] = count
        flag_source = "ABSL_FLAG definitions in each binary's sources and in-repo deps"

    readme = os.path.join(root, "README.md")
    readme_lines = read(readme).count("\n") if os.path.exists(readme) else 0
    scope = " ".join(args.paths) if args.paths else "the whole tree"

    core = [f for f in functions
            if f[2].startswith(SERVING_CORE) and not re.search(r"_test\.\w+$", f[2])]
    summary = [
        ["README.md lines", readme_lines],
        ["C++ files (%s)" % scope, len(files)],
        ["C++ lines (%s)" % scope, sum(n for n, _ in file_lines)],
        ["functions over %d lines" % args.long, sum(1 for f in functions if f[0] > args.long)],
        ["largest function (lines)", functions[0][0] if functions else 0],
        ["serving core: functions over %d lines" % args.long,
         sum(1 for f in core if f[0] > args.long)],
        ["serving core: largest function (lines)", core[0][0] if core else 0],
        ["largest file (lines)", file_lines[0][0] if file_lines else 0],
    ]
    for label in sorted(per_binary):
        summary.append(["flags %s" % label, per_binary[label]])

    out = []
    out.append("== summary (%s) ==" % scope)
    if args.before:
        before = read_summary(args.before)
        rows = []
        for metric, value in summary:
            old = before.get(metric, "")
            change = ""
            if re.fullmatch(r"-?\d+", str(old)):
                change = "%+d" % (value - int(old))
            rows.append([metric, old, value, change])
        for metric in before:
            if metric not in dict(summary):
                rows.append([metric, before[metric], "", ""])
        out.append(table(rows, ["metric", "before", "after", "change"]))
    else:
        out.append(table(summary, ["metric", "value"]))
    out.append("")
    out.append("== largest functions (%s; top %d) ==" % (scope, args.top))
    out.append(table([[n, name, "%s:%d" % (path, line)]
                      for n, name, path, line in functions[:args.top]],
                     ["lines", "function", "file:line"]))
    out.append("")
    out.append("== largest C++ files (%s; top %d) ==" % (scope, args.top))
    out.append(table([[n, path] for n, path in file_lines[:args.top]], ["lines", "file"]))
    out.append("")
    out.append("== flags per binary (%s) ==" % flag_source)
    out.append(table([[per_binary[b], b] for b in sorted(per_binary, key=lambda b: (-per_binary[b], b))],
                     ["flags", "binary"]))
    out.append("")
    out.append("== flags per file (ABSL_FLAG definitions) ==")
    out.append(table([[k, f] for f, k in sorted(per_file.items(), key=lambda x: (-x[1], x[0]))],
                     ["flags", "file"]))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
