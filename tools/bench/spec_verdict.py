#!/usr/bin/env python3
"""Issue 12's criterion on a spec_sweep.sh results file: per drafter and concurrency, is the
adaptive node at least the best fixed draft length, and never below no speculation?

Usage: spec_verdict.py [--field decode_tok_s] RESULTS.tsv

Each configuration's figure is the median over rounds of its ratio to the `off` run of the same
round and concurrency (as spec_sweep.sh's table: x/off). The best fixed length is the one with
the highest median. Besides the medians, the rounds are paired: in how many rounds the adaptive
node's ratio was at least the best fixed length's (that round) and at least 1. The machine's
noise moves single rounds by 4-15%, so the paired counts say how far one sweep's verdict can be
trusted. Prints one line per cell and a summary; exits 0 whatever the verdict (a report, not a
test), 2 on a file it cannot use.
"""
import argparse
import collections
import csv
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--field", default="decode_tok_s",
                    help="the results column compared (default decode_tok_s)")
    ap.add_argument("results")
    args = ap.parse_args()
    rows = list(csv.DictReader(open(args.results), delimiter="\t"))
    need = {"repeat", "config", "concurrency", args.field}
    if not rows or not need <= set(rows[0]):
        print("%s: expected a spec_sweep.sh results file with columns %s" %
              (args.results, ", ".join(sorted(need))), file=sys.stderr)
        return 2
    value = {}
    for r in rows:
        value[(r["config"], int(r["concurrency"]), r["repeat"])] = float(r[args.field])
    # ratio[(config, c)] = {repeat: value / off's value that round}
    ratio = collections.defaultdict(dict)
    for (config, c, rep), v in value.items():
        off = value.get(("off", c, rep))
        if off and off > 0:
            ratio[(config, c)][rep] = v / off
    methods = sorted({k[0].rsplit("-", 1)[0] for k in ratio if k[0] != "off" and "-" in k[0]})
    cells = met = 0
    for m in methods:
        for c in sorted({k[1] for k in ratio if k[0].startswith(m + "-")}):
            adaptive = ratio.get((m + "-adaptive", c))
            fixed = {k[0]: v for k, v in ratio.items()
                     if k[1] == c and k[0].startswith(m + "-k") and k[0][len(m) + 2:].isdigit()}
            if not adaptive or not fixed:
                continue
            best = max(fixed, key=lambda f: statistics.median(fixed[f].values()))
            a = statistics.median(adaptive.values())
            b = statistics.median(fixed[best].values())
            paired = [rep for rep in adaptive if rep in fixed[best]]
            won = sum(adaptive[rep] >= fixed[best][rep] for rep in paired)
            above = sum(v >= 1.0 for v in adaptive.values())
            ok = a >= b and a >= 1.0
            cells += 1
            met += ok
            print("%-12s c=%-3d adaptive %.3f, best fixed %s %.3f: %s (rounds won %d/%d); "
                  "no speculation: %s (rounds %d/%d)%s" %
                  (m, c, a, best[len(m) + 1:], b, "at least" if a >= b else "behind", won,
                   len(paired), "at least" if a >= 1.0 else "below", above, len(adaptive),
                   "" if ok else "  <- not met"))
    print("criterion met in %d of %d cells" % (met, cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
