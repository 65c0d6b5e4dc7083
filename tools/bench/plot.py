#!/usr/bin/env python3
"""Plots of tools/bench records (--records_out JSON lines): latency CDFs per side, and, when
several files from runs at different rates are given, throughput and p90 latency vs rate.

    pip install matplotlib      # any recent version
    python3 tools/bench/plot.py --out /tmp/plots run_rate1.jsonl run_rate4.jsonl

File names may carry the rate as `--label rate=...`; otherwise the measured request throughput is
used as the x axis.

    python3 tools/bench/plot.py --out docs --goodput goodput.json   # bench --goodput_json

draws goodput, TTFT p90 and ITL p90 against the offered rate, one line per configuration, with
the SLOs as dashed lines (goodput.png).
"""
import argparse
import collections
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def metrics(records):
    ttft, itl, e2e = [], [], []
    done, first, last, tokens = 0, None, None, 0
    for r in records:
        if r.get("warmup"):
            continue
        first = r["send_s"] if first is None else min(first, r["send_s"])
        last = r["end_s"] if last is None else max(last, r["end_s"])
        if not r["ok"]:
            continue
        done += 1
        tokens += r["completion_tokens"]
        e2e.append((r["end_s"] - r["send_s"]) * 1e3)
        c = r["chunk_times_s"]
        if c:
            ttft.append((c[0] - r["send_s"]) * 1e3)
            itl += [(b - a) * 1e3 for a, b in zip(c, c[1:])]
    dur = max((last or 0) - (first or 0), 1e-9)
    return {"ttft": ttft, "itl": itl, "e2e": e2e, "rps": done / dur, "tps": tokens / dur}


def cdf(ax, values, label):
    if not values:
        return
    v = sorted(values)
    ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=label)


def p90(v):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(0.9 * (len(v) - 1) + 0.5))]


def plot_goodput(path, out):
    with open(path) as f:
        g = json.load(f)
    points = g["points"]
    configs = []
    for p in points:
        if p["config"] not in configs:
            configs.append(p["config"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for c in configs:
        ps = sorted((p for p in points if p["config"] == c), key=lambda p: p["rate"])
        xs = [p["rate"] for p in ps]
        axes[0].plot(xs, [p["goodput"] for p in ps], "o-", label=c)
        axes[1].plot(xs, [p["ttft_ms"]["p90"] for p in ps], "o-", label=c)
        axes[2].plot(xs, [p["itl_ms"]["p90"] for p in ps], "o-", label=c)
    if points:
        axes[1].axhline(points[0]["slo_ttft_ms"], color="gray", ls="--", lw=1, label="SLO")
        axes[2].axhline(points[0]["slo_itl_ms"], color="gray", ls="--", lw=1, label="SLO")
    names = ("goodput (req/s within both SLOs)", "TTFT p90 (ms)", "ITL p90 (ms)")
    for ax, name in zip(axes, names):
        ax.set_xlabel("offered rate (sessions/s)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[1].set_yscale("log")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "goodput.png"), dpi=80)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("files", nargs="*")
    ap.add_argument("--out", required=True, help="output directory for PNG files")
    ap.add_argument("--rates", default="", help="comma-separated offered rates, one per file")
    ap.add_argument("--goodput", default="", help="a bench --goodput_json file to plot")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.goodput:
        plot_goodput(args.goodput, args.out)
        print(f"wrote {os.path.join(args.out, 'goodput.png')}")
    if not args.files:
        return
    rates = [float(x) for x in args.rates.split(",")] if args.rates else []
    by_side = collections.defaultdict(list)  # side -> [(file index, metrics)]
    for i, path in enumerate(args.files):
        groups = collections.defaultdict(list)
        for r in load(path):
            groups[r.get("side", "A")].append(r)
        for side, recs in groups.items():
            by_side[side].append((i, metrics(recs)))

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for side, runs in by_side.items():
        for i, m in runs:
            label = f"{side} {os.path.basename(args.files[i])}"
            for ax, key in zip(axes, ("ttft", "itl", "e2e")):
                cdf(ax, m[key], label)
    for ax, name in zip(axes, ("TTFT (ms)", "ITL (ms)", "E2E latency (ms)")):
        ax.set_xlabel(name)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "latency_cdf.png"), dpi=120)

    if len(args.files) > 1:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for side, runs in by_side.items():
            xs = [rates[i] if i < len(rates) else m["rps"] for i, m in runs]
            axes[0].plot(xs, [m["tps"] for _, m in runs], "o-", label=side)
            axes[1].plot(xs, [p90(m["ttft"]) for _, m in runs], "o-", label=side)
            axes[2].plot(xs, [p90(m["itl"]) for _, m in runs], "o-", label=side)
        for ax, name in zip(axes, ("output tokens/s", "TTFT p90 (ms)", "ITL p90 (ms)")):
            ax.set_xlabel("offered rate (sessions/s; measured req/s without --rates)")
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "vs_rate.png"), dpi=120)
    print(f"wrote plots to {args.out}")


if __name__ == "__main__":
    main()
