#!/usr/bin/env python3
"""deepinfer's CPU backend against llama.cpp on the same weights, in one command.

  tools/llamacpp_compare/compare.py --llama_cpp /path/to/llama.cpp --model /tmp/llama57m \
      --threads 2 --reps 5

--llama_cpp is a llama.cpp source tree with a CMake build in <tree>/build (or pass --llama_bin
for the directory holding llama-bench and llama-batched-bench). Nothing of llama.cpp is part of
this repository. The GGUF (BF16, Q/K rows permuted for llama.cpp's RoPE layout) is written next
to the checkpoint by hf_to_gguf.py unless --gguf names an existing one.

Each repetition runs, back to back and alternating which side goes first:
  llama-bench -p 512 -n 128 -r 1            vs  //engine:bench --batch 1 --prompt 0,512
  llama-batched-bench -npp P -ntg 128 -npl 1,8,32  vs  //engine:bench --batch 1,8,32 --prompt P
with the same thread count, and once the machine's read bandwidth (//engine:bench --bandwidth).
The report shows medians over the repetitions, the ratios (deepinfer / llama.cpp), the
batch-1 decode fraction of the memory-bandwidth bound, and the load average before and after.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def run(cmd):
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        sys.exit(f"command failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return res.stdout


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def llama_bench(bin_dir, gguf, threads, n_prompt, n_gen):
    out = run([os.path.join(bin_dir, "llama-bench"), "-m", gguf, "-t", str(threads), "-p",
               str(n_prompt), "-n", str(n_gen), "-r", "1", "-o", "json"])
    res = {}
    for row in json.loads(out):
        if row["n_prompt"] > 0 and row["n_gen"] == 0:
            res["pp"] = row["avg_ts"]
        elif row["n_gen"] > 0 and row["n_prompt"] == 0:
            res["tg"] = row["avg_ts"]
    return res


def llama_batched(bin_dir, gguf, threads, npp, ntg, npl):
    ctx = max(npl) * (npp + ntg) + 64
    out = run([os.path.join(bin_dir, "llama-batched-bench"), "-m", gguf, "-t", str(threads),
               "-tb", str(threads), "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(npp),
               "-ntg", str(ntg), "-npl", ",".join(map(str, npl)), "--output-format", "jsonl"])
    res = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            res[row["pl"]] = {"pp": row["speed_pp"], "tg": row["speed_tg"]}
    return res


def ours(bench, model, threads, batches, prompts, steps, extra=()):
    out = run([bench, "--model", model, "--threads", str(threads), "--batch",
               ",".join(map(str, batches)), "--prompt", ",".join(map(str, prompts)),
               "--decode_tokens", str(steps), "--reps", "1", "--json", *extra])
    return json.loads(out)


def check_logits(args, bin_dir, gguf):
    """Last-token logits of both implementations on the same random prompt."""
    import random
    exe = os.path.join(os.path.dirname(os.path.abspath(gguf)), "llama_logits")
    lib_dir = os.path.abspath(bin_dir)
    run(["g++", "-O2", "-std=c++17", os.path.join(HERE, "llama_logits.cc"), "-I",
         os.path.join(args.llama_cpp, "include"), "-I", os.path.join(args.llama_cpp, "ggml", "include"),
         "-L", lib_dir, "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib_dir}", "-o", exe])
    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(7)
    ids = [str(rng.randrange(3, vocab)) for _ in range(24)]
    theirs = json.loads(run([exe, gguf, str(args.threads), *ids]))["logits"]
    mine = json.loads(run([args.bench, "--model", args.model, "--threads", str(args.threads),
                           "--logits_tokens", ",".join(ids)]))["logits"]
    diffs = [abs(a - b) for a, b in zip(theirs, mine)]
    top = lambda v: max(range(len(v)), key=v.__getitem__)
    mean = lambda v: sum(v) / len(v)
    ma, mb = mean(theirs), mean(mine)
    cov = sum((a - ma) * (b - mb) for a, b in zip(theirs, mine))
    var_a = sum((a - ma) ** 2 for a in theirs)
    var_b = sum((b - mb) ** 2 for b in mine)
    print(f"logits check ({len(ids)} tokens, {os.path.basename(gguf)}): max |diff| "
          f"{max(diffs):.4f}, mean |diff| {mean(diffs):.4f}, correlation "
          f"{cov / (var_a * var_b) ** 0.5:.5f}, argmax {'agrees' if top(theirs) == top(mine) else 'DIFFERS'}")


def row_of(result, batch, prompt):
    for r in result["rows"]:
        if r["batch"] == batch and r["prompt"] == prompt:
            return r
    raise KeyError((batch, prompt))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama_cpp", required=True, help="llama.cpp source tree")
    ap.add_argument("--llama_bin", help="directory with llama-bench (default <llama_cpp>/build/bin)")
    ap.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    ap.add_argument("--gguf", help="GGUF of the same weights (written if missing)")
    ap.add_argument("--bench", default=os.path.join(REPO, "bazel-bin/engine/bench"),
                    help="deepinfer //engine:bench binary (bazel build -c opt //engine:bench)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pp", type=int, default=512, help="llama-bench prompt length")
    ap.add_argument("--tg", type=int, default=128, help="llama-bench generated tokens")
    ap.add_argument("--batched_npp", type=int, default=128)
    ap.add_argument("--batched_ntg", type=int, default=128)
    ap.add_argument("--npl", default="1,8,32", help="batched-bench parallel sequences")
    ap.add_argument("--skip_batched", action="store_true")
    ap.add_argument("--check_logits", action="store_true",
                    help="first compare last-token logits on a random prompt (compiles "
                         "llama_logits.cc against the llama.cpp build)")
    ap.add_argument("--json_out", help="also write all samples and medians here")
    args = ap.parse_args()

    bin_dir = args.llama_bin or os.path.join(args.llama_cpp, "build", "bin")
    for tool in ("llama-bench", "llama-batched-bench"):
        if not os.path.exists(os.path.join(bin_dir, tool)):
            sys.exit(f"{bin_dir}/{tool} not found; build llama.cpp first")
    if not os.path.exists(args.bench):
        sys.exit(f"{args.bench} not found; run: bazel build -c opt //engine:bench")
    gguf = args.gguf or os.path.join(args.model, "model-bf16.gguf")
    if not os.path.exists(gguf):
        run([sys.executable, os.path.join(HERE, "hf_to_gguf.py"), "--llama_cpp", args.llama_cpp,
             "--model", args.model, "--out", gguf])
    npl = [int(x) for x in args.npl.split(",")]
    if args.check_logits:
        check_logits(args, bin_dir, gguf)

    samples = {"ours_pp": [], "ours_tg": [], "llama_pp": [], "llama_tg": []}
    for b in npl:
        for k in ("ours_bpp", "ours_btg", "llama_bpp", "llama_btg"):
            samples[f"{k}{b}"] = []
    load_before = load()
    started = time.time()
    for rep in range(args.reps):
        order = ["llama", "ours"] if rep % 2 == 0 else ["ours", "llama"]
        for side in order:
            if side == "llama":
                r = llama_bench(bin_dir, gguf, args.threads, args.pp, args.tg)
                samples["llama_pp"].append(r["pp"])
                samples["llama_tg"].append(r["tg"])
            else:
                r = ours(args.bench, args.model, args.threads, [1], [0, args.pp], args.tg)
                samples["ours_tg"].append(row_of(r, 1, 0)["decode_tokens_per_s"])
                samples["ours_pp"].append(row_of(r, 1, args.pp)["prefill_tokens_per_s"])
        if args.skip_batched:
            continue
        for side in order:
            if side == "llama":
                r = llama_batched(bin_dir, gguf, args.threads, args.batched_npp, args.batched_ntg, npl)
                for b in npl:
                    samples[f"llama_bpp{b}"].append(r[b]["pp"])
                    samples[f"llama_btg{b}"].append(r[b]["tg"])
            else:
                r = ours(args.bench, args.model, args.threads, npl, [args.batched_npp], args.batched_ntg)
                for b in npl:
                    row = row_of(r, b, args.batched_npp)
                    samples[f"ours_bpp{b}"].append(row["prefill_tokens_per_s"])
                    samples[f"ours_btg{b}"].append(row["decode_tokens_per_s"])
        print(f"rep {rep + 1}/{args.reps} done (load {load()})", file=sys.stderr)
    # The bandwidth bound: decode at batch 1 from an empty context, with the bandwidth measured
    # in the same process right after.
    bw = ours(args.bench, args.model, args.threads, [1], [0], args.tg, ["--bandwidth"])
    load_after = load()

    med = {k: statistics.median(v) for k, v in samples.items() if v}
    print(f"threads {args.threads}, {args.reps} repetitions (medians), load average "
          f"{load_before} -> {load_after}, {time.time() - started:.0f} s")
    print(f"{'test':<22} {'llama.cpp tok/s':>16} {'deepinfer tok/s':>16} {'ratio':>7}")

    def line(name, lk, ok):
        print(f"{name:<22} {med[lk]:>16.1f} {med[ok]:>16.1f} {med[ok] / med[lk]:>7.2f}")

    line(f"pp{args.pp}", "llama_pp", "ours_pp")
    line(f"tg{args.tg}", "llama_tg", "ours_tg")
    if not args.skip_batched:
        for b in npl:
            line(f"batched pp{args.batched_npp} x{b}", f"llama_bpp{b}", f"ours_bpp{b}")
            line(f"batched tg{args.batched_ntg} x{b}", f"llama_btg{b}", f"ours_btg{b}")
        for side, key in (("llama.cpp", "llama_btg"), ("deepinfer", "ours_btg")):
            scale = " ".join(f"x{b}:{med[f'{key}{b}'] / med[f'{key}{npl[0]}']:.2f}" for b in npl)
            print(f"batched decode scaling {side:<10} {scale}")
    row = row_of(bw, 1, 0)
    print(f"read bandwidth {bw['read_bandwidth_gb_per_s']:.1f} GB/s; decode step reads "
          f"{row['decode_step_bytes'] / 1e6:.1f} MB; bound {row['decode_bound_tokens_per_s']:.1f} "
          f"tok/s; measured {row['decode_tokens_per_s']:.1f} tok/s = "
          f"{100 * row['decode_fraction_of_bound']:.0f}% of the bound")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"samples": samples, "medians": med, "bandwidth": bw,
                       "load_before": load_before, "load_after": load_after,
                       "threads": args.threads, "reps": args.reps}, f, indent=1)


if __name__ == "__main__":
    main()
