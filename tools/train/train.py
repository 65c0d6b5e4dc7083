"""Trains the demo tokenizer, draft and target models from a fixed seed (CPU, float32).

  /work/fixtures-venv/bin/python tools/train/train.py --work_dir /tmp/demo-train \
      --draft_steps N --target_steps M

Writes into --work_dir: tokenizer/ (tokenizer.json, tokenizer_config.json, chat_template.jinja),
manifest.json (corpus files and split), and per model ckpt_<name>/ (save_pretrained, float32,
rewritten every --ckpt_every steps) plus log_<name>.jsonl. export_and_eval.py turns the
checkpoints into models/demo and models/demo-draft.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import random
import time

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import common

SEQ_LEN = 384
COPY_FRACTION = 0.5  # Share of training sequences that start with one copy/edit chat.
NUM_COPY_EXAMPLES = 20000

MODEL_SHAPES = {
    # ~11M parameters: 6 layers alternating sliding/full attention (issue 11 asks for 10-30M).
    "target": dict(
        hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
        num_key_value_heads=2,
        layer_types=["sliding_attention", "full_attention"] * 3,
        lr=1.5e-3,
    ),
    "draft": dict(
        hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, layer_types=["sliding_attention", "full_attention"], lr=3e-3,
    ),
}
SLIDING_WINDOW = 64


def model_config(name: str, tok) -> Qwen2Config:
    shape = dict(MODEL_SHAPES[name])
    shape.pop("lr")
    bos = tok.convert_tokens_to_ids(common.BOS)
    im_end = tok.convert_tokens_to_ids(common.IM_END)
    return Qwen2Config(
        vocab_size=common.VOCAB_SIZE,
        max_position_embeddings=2048,
        sliding_window=SLIDING_WINDOW,
        use_sliding_window=True,
        max_window_layers=0,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=[im_end, bos],
        pad_token_id=bos,
        attention_dropout=0.0,
        **shape,
    )


def prepare(work: pathlib.Path, seed: int):
    """Tokenizer, manifest, token stream of the training files and encoded copy examples."""
    train_files, held_files = common.corpus_files()
    texts = [common.read(p) for p in train_files]
    tok_dir = work / "tokenizer"
    if (tok_dir / "tokenizer.json").exists():
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(tok_dir)
    else:
        t0 = time.time()
        tok = common.wrap_tokenizer(common.train_tokenizer(texts))
        tok.save_pretrained(tok_dir)
        print(f"tokenizer trained in {time.time() - t0:.1f}s", flush=True)
    manifest = {
        "source": str(common.STDLIB_DIR),
        "license": "Python Software Foundation License Version 2 (" + str(common.LICENSE_FILE)
        + ")",
        "train_files": [
            {"name": p.name, "bytes": p.stat().st_size,
             "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in train_files],
        "held_out_files": [
            {"name": p.name, "bytes": p.stat().st_size,
             "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in held_files],
        "excluded_files": list(common.EXCLUDED),
    }
    common.write_json(work / "manifest.json", manifest)

    bos = tok.convert_tokens_to_ids(common.BOS)
    stream = []
    for enc in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        stream.append(bos)
        stream.extend(enc.ids)
    stream = np.array(stream, dtype=np.int64)

    rng = random.Random(seed)
    examples = common.copy_examples(rng, texts, NUM_COPY_EXAMPLES)
    rendered = [
        tok.apply_chat_template(common.copy_messages(c, i, e), tokenize=False)
        for c, i, e in examples[:3]
    ]
    manual = [
        f"{common.BOS}{common.IM_START}user\n{c}\n\nRewrite it with one change: {i}{common.IM_END}\n"
        f"{common.IM_START}assistant\n{e}{common.IM_END}\n" for c, i, e in examples
    ]
    if rendered != manual[:3]:
        raise RuntimeError(f"chat template mismatch: {rendered[0]!r} vs {manual[0]!r}")
    copy = [np.array(e.ids, dtype=np.int64)
            for e in tok.backend_tokenizer.encode_batch(manual, add_special_tokens=False)]
    copy = [c for c in copy if len(c) <= SEQ_LEN // 2 + 64]
    print(f"stream {len(stream)} tokens from {len(texts)} files; {len(copy)} copy examples "
          f"(mean {np.mean([len(c) for c in copy]):.0f} tokens)", flush=True)
    return tok, stream, copy


def make_batch(rng: np.random.Generator, stream, copy, batch_size: int,
               copy_fraction: float = COPY_FRACTION) -> torch.Tensor:
    """Rows of SEQ_LEN tokens: with probability copy_fraction one copy/edit chat first (with
    copy_fraction 1, as many whole ones as fit), then a random window of the code stream."""
    rows = []
    for _ in range(batch_size):
        parts = []
        n = 0
        while rng.random() < copy_fraction:
            ex = copy[rng.integers(len(copy))]
            if n + len(ex) > SEQ_LEN - 8:
                break
            parts.append(ex)
            n += len(ex)
            if copy_fraction < 1:
                break
        rest = SEQ_LEN - n
        start = rng.integers(0, len(stream) - rest)
        parts.append(stream[start:start + rest])
        rows.append(np.concatenate(parts))
    return torch.from_numpy(np.stack(rows))


def train_one(name: str, tok, stream, copy, steps: int, batch_size: int, seed: int,
              work: pathlib.Path, ckpt_every: int, budget_s: float = 0,
              init_from: pathlib.Path | None = None, copy_fraction: float = COPY_FRACTION,
              lr: float | None = None, ckpt_name: str | None = None,
              deadline: bool = False) -> None:
    """Trains `name` for `steps` steps; with budget_s > 0 the step count is lowered after 10
    steps so that training fits the budget (the log and progress.json record the final count,
    which reproduces the run when passed back as --<name>_steps without a budget)."""
    torch.manual_seed(seed)
    config = model_config(name, tok)
    if init_from is not None:
        model = Qwen2ForCausalLM.from_pretrained(init_from, dtype=torch.float32)
    else:
        model = Qwen2ForCausalLM(config)
    ckpt_name = ckpt_name or name
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[{name}] {n_params / 1e6:.2f}M parameters, {steps} steps x {batch_size} x {SEQ_LEN}",
          flush=True)
    lr = lr or MODEL_SHAPES[name]["lr"]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    warmup = 30

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    rng = np.random.default_rng(seed)
    log = open(work / f"log_{ckpt_name}.jsonl", "w")
    t0 = time.time()
    ema = None
    step = 0
    if deadline:
        steps = 10**9  # until the budget is spent
    while step < steps:
        if budget_s > 0 and step == 10 and not deadline:
            per_step = (time.time() - t0) / 10
            steps = max(warmup + 10, min(steps, int(budget_s / per_step)))
            print(f"[{name}] {per_step:.1f}s/step: {steps} steps fit the budget", flush=True)
        if deadline and step > warmup:
            # Wall-clock schedule (shared machines): the cosine follows elapsed time, and training
            # ends when the budget is spent; the log records the steps that fitted.
            progress = (time.time() - t0) / budget_s
            if progress >= 1.0:
                print(f"[{name}] budget spent after {step} steps", flush=True)
                model.save_pretrained(work / f"ckpt_{ckpt_name}")
                (work / f"ckpt_{ckpt_name}" / "progress.json").write_text(json.dumps(
                    {"step": step, "steps": step, "batch_size": batch_size, "seq_len": SEQ_LEN,
                     "elapsed_s": round(time.time() - t0, 1), "ema_loss": ema,
                     "schedule": "wall_clock", "budget_s": budget_s}))
                break
            lr_override = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        else:
            lr_override = None
        for g in opt.param_groups:
            g["lr"] = lr_at(step) if lr_override is None else lr_override
        ids = make_batch(rng, stream, copy, batch_size, copy_fraction)
        out = model(input_ids=ids, labels=ids)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = out.loss.item()
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        rec = {"step": step + 1, "loss": round(loss, 4), "ema": round(ema, 4),
               "lr": opt.param_groups[0]["lr"], "elapsed_s": round(time.time() - t0, 1)}
        log.write(json.dumps(rec) + "\n")
        if (step + 1) % 10 == 0:
            log.flush()
            print(f"[{name}] {rec}", flush=True)
        if (step + 1) % ckpt_every == 0 or step + 1 == steps:
            model.save_pretrained(work / f"ckpt_{ckpt_name}")
            (work / f"ckpt_{ckpt_name}" / "progress.json").write_text(json.dumps(
                {"step": step + 1, "steps": steps, "batch_size": batch_size, "seq_len": SEQ_LEN,
                 "elapsed_s": round(time.time() - t0, 1), "ema_loss": ema}))
        step += 1
    log.close()
    print(f"[{name}] done in {time.time() - t0:.0f}s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work_dir", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--draft_steps", type=int, default=150)
    ap.add_argument("--target_steps", type=int, default=420)
    ap.add_argument("--batch_size", type=int, default=8)
    ap.add_argument("--draft_budget_s", type=float, default=0)
    ap.add_argument("--target_budget_s", type=float, default=0)
    ap.add_argument("--ckpt_every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copy_steps", type=int, default=300)
    ap.add_argument("--copy_budget_s", type=float, default=0)
    ap.add_argument("--wall_clock", action="store_true",
                    help="budgets are deadlines: the LR cosine follows elapsed time")
    ap.add_argument("--models", default="target,draft", help="which to train, in order")
    ap.add_argument("--bench", action="store_true", help="time a few steps of each and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = pathlib.Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    tok, stream, copy = prepare(work, args.seed)
    if args.bench:
        for name in ("draft", "target"):
            torch.manual_seed(0)
            model = Qwen2ForCausalLM(model_config(name, tok))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            rng = np.random.default_rng(0)
            for i in range(4):
                if i == 1:
                    t0 = time.time()
                ids = make_batch(rng, stream, copy, args.batch_size)
                loss = model(input_ids=ids, labels=ids).loss
                opt.zero_grad()
                loss.backward()
                opt.step()
            print(f"{name}: {(time.time() - t0) / 3:.2f}s/step", flush=True)
        return
    # Each model seeds its own RNGs, so training them in one process or separately is the same.
    for name in args.models.split(","):
        if name == "draft":
            train_one("draft", tok, stream, copy, args.draft_steps, args.batch_size,
                      args.seed + 1, work, args.ckpt_every, args.draft_budget_s)
        elif name == "target":
            train_one("target", tok, stream, copy, args.target_steps, args.batch_size,
                      args.seed + 2, work, args.ckpt_every, args.target_budget_s,
                      deadline=args.wall_clock)
        elif name == "target_copy":
            # Stage 2: continue the target on copy/edit chats packed back to back.
            train_one("target", tok, stream, copy, args.copy_steps, args.batch_size,
                      args.seed + 3, work, args.ckpt_every, init_from=work / "ckpt_target",
                      copy_fraction=1.0, lr=1e-3, ckpt_name="target_copy",
                      budget_s=args.copy_budget_s, deadline=args.wall_clock)
        elif name == "draft_anneal":
            # Continue a stopped draft run from its last checkpoint with a fresh, lower cosine
            # (same data mix as stage 1); written to ckpt_draft_anneal.
            train_one("draft", tok, stream, copy, args.draft_steps, args.batch_size,
                      args.seed + 4, work, args.ckpt_every, args.draft_budget_s,
                      init_from=work / "ckpt_draft", lr=1e-3, ckpt_name="draft_anneal",
                      deadline=args.wall_clock)
        else:
            raise SystemExit(f"--models: unknown model {name!r}")


if __name__ == "__main__":
    main()
