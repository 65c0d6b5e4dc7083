#!/usr/bin/env python3
"""Summarises a decode node's step-trace lines (spec_sweep.sh with SWEEP_TRACE=1, or any worker
at --log_level=debug): per speculative mode and number of decoding sequences, the steps, their
share of the time, median period, forward and drafting times, drafts verified and accepted, tokens
emitted per step and milliseconds per emitted token.

  tools/bench/step_trace_summary.py [--skip FRACTION] [--max_decoding N] LOG [LOG ...]
  tools/bench/step_trace_summary.py --trials [--min_steps N] LOG [LOG ...]

mode: the selector's mode (-1 the plan, 0 no drafting, L a fixed draft length) or "node" for a
node without the selector (its decoding count is then the step's sampled sequences). --skip drops
the first FRACTION of each log's steps (an adaptive node's first minutes measure its modes).

--trials: instead, each interleaved trial of the selector (a stretch of steps alternating between
two modes, the mode on trial first): its steps, decoding counts, measured steps per side (with a
period) and the ratio of the two sides' tokens per second over them (mode on trial / the other),
for trials with at least --min_steps (default 3) such steps a side. The selector itself counts only
the steps in the bucket where the trial began, so its figure can differ where the count moved.

  tools/bench/step_trace_summary.py --runs [--gap SECONDS] [--peak LO-HI] [--last N] LOG [LOG ...]

--runs: instead, each run of the log (spec_sweep.sh runs one benchmark at a time on a node: steps
more than --gap seconds apart, default 4, begin a new run), the runs whose peak decoding count is
in [LO, HI] (--peak 1-1: a sweep's concurrency-1 runs), the last N of them: tokens per
millisecond of step period, and the share of the time and the tokens/ms of each kind of step:
steady, catch-up (a draft model caught up on a new prompt or on skipped steps: catch_up_us > 0),
prefill (the step carried prompt tokens: more tokens than its decoding sequences and verified
drafts) and warm-up (an adaptive node's unmeasured steps after a change of mode). Then the same
pooled over the runs kept. Steps without a period (the first after an idle engine, often a new
turn's prefill) are left out, as in the summary. A node without the selector logs measured=0 for
every step: its steps are never warm-up. Comparing two nodes run by run tells machine drift (both
slower in the same run) from what each node does.
"""
import argparse
import collections
import datetime
import statistics
import sys


MARK = "step-trace mode="


def parse(line):
    text = line.split(MARK, 1)[1]
    fields = dict(kv.split("=", 1) for kv in ("mode=" + text).split() if "=" in kv)
    return {k: float(v) for k, v in fields.items()}


def read_steps(path):
    with open(path) as f:
        return [parse(line) for line in f if MARK in line]


def decoding(s):
    """A step's decoding sequences: a node without the selector (mode -2) logs them as samples."""
    return s["decoding"] if s["mode"] != -2 else s["samples"]


def read_timed_steps(path):
    """(seconds since the epoch, step) per step-trace line, from the line's leading timestamp."""
    steps = []
    with open(path) as f:
        for line in f:
            if MARK not in line:
                continue
            stamp = line.split(None, 1)[0].replace("Z", "+00:00")
            steps.append((datetime.datetime.fromisoformat(stamp).timestamp(), parse(line)))
    return steps


KINDS = ("steady", "catch-up", "prefill", "warm-up")


def kind(s):
    if s["tokens"] > decoding(s) + s["verified"]:
        return "prefill"
    if s.get("catch_up_us", 0.0) > 0:
        return "catch-up"
    if s["mode"] != -2 and not s["measured"]:
        return "warm-up"
    return "steady"


def kinds_text(steps):
    """Total seconds and tokens of steps with a period, and per kind: share of time, tokens/ms."""
    by = collections.defaultdict(lambda: [0.0, 0.0])
    count = 0
    for s in steps:
        if s["period_us"] > 0:
            t = by[kind(s)]
            t[0] += s["period_us"] / 1e6
            t[1] += s["samples"] + s["accepted"]
            count += 1
    seconds = sum(t[0] for t in by.values())
    tokens = sum(t[1] for t in by.values())
    parts = ["%s %.1f%% %.3f" % (k, 100.0 * by[k][0] / seconds, by[k][1] / by[k][0] / 1e3)
             for k in KINDS if by[k][0] > 0]
    rate = tokens / seconds / 1e3 if seconds > 0 else 0.0
    return "%d steps, %.3f s, %.3f tokens/ms%s" % (count, seconds, rate,
                                                   "".join(" | " + p for p in parts))


def runs(path, gap, peak, last, out):
    timed = read_timed_steps(path)
    found = []  # [first step, last step] of each run, 0-based indexes into timed
    for i, (t, _) in enumerate(timed):
        if not found or t - timed[i - 1][0] > gap:
            found.append([i, i])
        found[-1][1] = i
    kept = []
    for number, (first, end) in enumerate(found, 1):
        steps = [s for _, s in timed[first:end + 1]]
        top = max(int(decoding(s)) for s in steps)
        if peak[0] <= top <= peak[1]:
            kept.append((number, first, end, top, steps))
    if last > 0:
        kept = kept[-last:]
    for number, first, end, top, steps in kept:
        out.write("%s run %d (steps %d-%d, peak %d): %s\n" %
                  (path, number, first + 1, end + 1, top, kinds_text(steps)))
    pooled = [s for *_, steps in kept for s in steps]
    out.write("%s: %d runs, %s\n" % (path, len(kept), kinds_text(pooled)))


def summarise(path, skip, max_decoding, out):
    steps = read_steps(path)
    steps = steps[int(len(steps) * skip):]
    groups = collections.defaultdict(list)
    for s in steps:
        if s["period_us"] <= 0:  # the first step after an idle engine has no period
            continue
        n = int(decoding(s))
        if n < 1:
            continue
        groups[(int(s["mode"]) if s["mode"] != -2 else None, min(n, max_decoding))].append(s)
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


def trials(path, min_steps, out):
    steps = read_steps(path)
    i = 0
    while i + 2 < len(steps):
        a, b = int(steps[i]["mode"]), int(steps[i + 1]["mode"])
        if a == -2 or b == -2 or a == b or int(steps[i + 2]["mode"]) != a:
            i += 1
            continue
        j = i
        while j < len(steps) and int(steps[j]["mode"]) == (a if (j - i) % 2 == 0 else b):
            j += 1
        side = {a: [0, 0.0, 0.0], b: [0, 0.0, 0.0]}  # measured steps, tokens, seconds
        for s in steps[i:j]:
            if s["measured"] and s["period_us"] > 0:
                t = side[int(s["mode"])]
                t[0] += 1
                t[1] += s["samples"] + s["accepted"]
                t[2] += s["period_us"] / 1e6
        if side[a][0] >= min_steps and side[b][0] >= min_steps and side[a][2] > 0 and \
                side[b][2] > 0 and side[b][1] > 0:
            counts = [int(s["decoding"]) for s in steps[i:j]]
            ratio = (side[a][1] / side[a][2]) / (side[b][1] / side[b][2])
            out.write("%s: steps %d-%d, mode %d vs %d, decoding %d-%d, measured %d/%d, "
                      "rate ratio %.3f\n" % (path, i + 1, j, a, b, min(counts), max(counts),
                                             side[a][0], side[b][0], ratio))
        i = max(j - 1, i + 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--skip", type=float, default=0.0)
    p.add_argument("--max_decoding", type=int, default=64)
    p.add_argument("--trials", action="store_true")
    p.add_argument("--min_steps", type=int, default=3)
    p.add_argument("--runs", action="store_true")
    p.add_argument("--gap", type=float, default=4.0)
    p.add_argument("--peak", default="1-1000000")
    p.add_argument("--last", type=int, default=0)
    p.add_argument("logs", nargs="+")
    a = p.parse_args()
    if not a.gap > 0:
        sys.exit("--gap: expected seconds > 0, got %s" % a.gap)
    try:
        peak = tuple(int(x) for x in a.peak.split("-"))
    except ValueError:
        peak = ()
    if len(peak) != 2 or not 0 <= peak[0] <= peak[1]:
        sys.exit("--peak: expected LO-HI with 0 <= LO <= HI, got %s" % a.peak)
    if a.last < 0:
        sys.exit("--last: expected >= 0 (0: every run), got %s" % a.last)
    if not 0.0 <= a.skip < 1.0:
        sys.exit("--skip: expected a fraction in [0, 1), got %s" % a.skip)
    if a.min_steps < 1:
        sys.exit("--min_steps: expected >= 1, got %s" % a.min_steps)
    for path in a.logs:
        if a.runs:
            runs(path, a.gap, peak, a.last, sys.stdout)
        elif a.trials:
            trials(path, a.min_steps, sys.stdout)
        else:
            summarise(path, a.skip, a.max_decoding, sys.stdout)


if __name__ == "__main__":
    main()
