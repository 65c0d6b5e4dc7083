#!/usr/bin/env python3
"""Summarises a decode node's step-trace lines (spec_sweep.sh with SWEEP_TRACE=1, or any worker
at --log_level=debug): per speculative mode and number of decoding sequences, the steps, their
share of the time, median period, forward and drafting times, drafts verified and accepted, tokens
emitted per step and milliseconds per emitted token.

  tools/bench/step_trace_summary.py [--skip FRACTION] [--max_decoding N] LOG [LOG ...]

mode: the selector's mode (-1 the plan, 0 no drafting, L a fixed draft length) or "node" for a
node without the selector (its decoding count is then the step's sampled sequences). --skip drops
the first FRACTION of each log's steps (an adaptive node's first minutes measure its modes).
"""
import argparse
import collections
import statistics
import sys


MARK = "step-trace mode="


def parse(line):
    text = line.split(MARK, 1)[1]
    fields = dict(kv.split("=", 1) for kv in ("mode=" + text).split() if "=" in kv)
    return {k: float(v) for k, v in fields.items()}


def summarise(path, skip, max_decoding, out):
    steps = []
    with open(path) as f:
        for line in f:
            if MARK in line:
                steps.append(parse(line))
    steps = steps[int(len(steps) * skip):]
    groups = collections.defaultdict(list)
    for s in steps:
        if s["period_us"] <= 0:  # the first step after an idle engine has no period
            continue
        adaptive = s["mode"] != -2
        n = int(s["decoding"] if adaptive else s["samples"])
        if n < 1:
            continue
        groups[(int(s["mode"]) if adaptive else None, min(n, max_decoding))].append(s)
    total = sum(s["period_us"] for g in groups.values() for s in g)
    emitted = sum(s["samples"] + s["accepted"] for g in groups.values() for s in g)
    out.write("%s: %d steps, %.3f s, %d tokens, %.1f tokens/s\n" %
              (path, sum(len(g) for g in groups.values()), total / 1e6, emitted,
               emitted / (total / 1e6) if total > 0 else 0.0))
    out.write("%-5s %4s %6s %6s %8s %8s %8s %8s %8s %8s %7s\n" %
              ("mode", "n", "steps", "time%", "period", "forward", "draft", "verified",
               "accepted", "tok/step", "ms/tok"))
    for (mode, n), g in sorted(groups.items(), key=lambda kv: (kv[0][0] is not None,
                                                               kv[0][0] or 0, kv[0][1])):
        seconds = sum(s["period_us"] for s in g) / 1e6
        tokens = sum(s["samples"] + s["accepted"] for s in g)
        label = "node" if mode is None else str(mode)
        out.write("%-5s %4s %6d %6.1f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %7.2f\n" % (
            label, ("%d" % n) + ("+" if n == max_decoding else ""), len(g),
            100.0 * seconds / (total / 1e6),
            statistics.median(s["period_us"] for s in g) / 1e3,
            statistics.median(s["forward_us"] for s in g) / 1e3,
            statistics.median(s["draft_us"] for s in g) / 1e3,
            statistics.mean(s["verified"] for s in g),
            statistics.mean(s["accepted"] for s in g),
            tokens / len(g), 1e3 * seconds / tokens if tokens else 0.0))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--skip", type=float, default=0.0)
    p.add_argument("--max_decoding", type=int, default=64)
    p.add_argument("logs", nargs="+")
    a = p.parse_args()
    if not 0.0 <= a.skip < 1.0:
        sys.exit("--skip: expected a fraction in [0, 1), got %s" % a.skip)
    for path in a.logs:
        summarise(path, a.skip, a.max_decoding, sys.stdout)


if __name__ == "__main__":
    main()
