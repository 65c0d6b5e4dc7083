#!/usr/bin/env python3
"""Issue 12's criterion on a spec_sweep.sh results file: per drafter and concurrency, is the
adaptive node at least the best fixed draft length, and never below no speculation?

Usage: spec_verdict.py [--field decode_tok_s] RESULTS.tsv

Each configuration's figure is the median over rounds of its ratio to no speculation in the same
round and concurrency (as spec_sweep.sh's table: x/off). With a `slot` column (the run's place in
its round's order; spec_sweep.sh runs `off` first, again after every few other configurations and
last) the baseline of a run is the `off` runs on either side of it, interpolated linearly by slot
(the nearest one alone at an end): the machine's speed drifts by tens of percent over minutes, and
a single `off` run anywhere in the round put that drift into every other configuration's ratio
(one configuration's three rounds at 0.72, 1.24 and 1.26). Without it,
the round's one `off` run. The best fixed length is the one with
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


def baseline(runs, slot):
    """No speculation's figure for a run at `slot`, from `runs` = [(slot, off's figure)] of the
    same round and concurrency: interpolated between the nearest off runs before and after it,
    the nearest one alone at an end; None without any."""
    before = [r for r in runs if r[0] <= slot]
    after = [r for r in runs if r[0] >= slot]
    if before and after:
        (s0, v0), (s1, v1) = max(before), min(after)
        return v0 if s1 == s0 else v0 + (v1 - v0) * (slot - s0) / (s1 - s0)
    if before or after:
        return max(before)[1] if before else min(after)[1]
    return None


def baseline_ratios(rows, field):
    """{(config, concurrency): {repeat: the run's figure / no speculation's}}: against the
    bracketing off runs with a `slot` column (see above), else against the round's off run. Off
    itself is 1 in every round that has it."""
    slotted = rows and "slot" in rows[0]
    off = collections.defaultdict(list)  # (c, repeat) -> [(slot, value)]
    for r in rows:
        if r["config"] == "off":
            off[(int(r["concurrency"]), r["repeat"])].append(
                (int(r["slot"]) if slotted else 0, float(r[field])))
    ratio = collections.defaultdict(dict)
    for r in rows:
        c, rep = int(r["concurrency"]), r["repeat"]
        if r["config"] == "off":
            if any(v > 0 for _, v in off[(c, rep)]):
                ratio[("off", c)][rep] = 1.0
            continue
        base = baseline(off.get((c, rep), []), int(r["slot"]) if slotted else 0)
        if base and base > 0:
            ratio[(r["config"], c)][rep] = float(r[field]) / base
    return ratio


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
    # ratio[(config, c)] = {repeat: value / off's value that round}
    ratio = baseline_ratios(rows, args.field)
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
