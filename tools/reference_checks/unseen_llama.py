"""Checks //engine:generate against Hugging Face transformers on a Llama checkpoint that none of
the committed fixtures resemble: other sizes (hidden 96, 3 layers, 6 heads / 3 KV heads, head_dim
16, intermediate 200), its own freshly trained byte-level BPE tokenizer with a different
vocabulary size, default (unscaled) RoPE with another theta, bf16 and f32 variants.

For each prompt it compares greedy tokens (must be identical) and the top-5 logprobs that
`generate --json --logprobs 5` reports against transformers' log-softmax (within the engine's
stated tolerance: 1e-3 for float32, 0.1 for bfloat16).

Not run in CI (needs torch + transformers):
  python tools/reference_checks/unseen_llama.py --generate bazel-bin/engine/generate
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n",
    "def move_button(layout, x, y):\n    layout.button.position = (x, y)\n    return layout\n",
    "Grüße aus München — 東京の天気は晴れです 🌤️",
    "SELECT name, count(*) FROM users GROUP BY name ORDER BY 2 DESC;",
]
PROMPTS = [
    "Move the login button to the top right",
    "def add(a, b):\n    return",
    "Grüße, 東京 🌤️ and SELECT * FROM t;",
]


def train_tokenizer(vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generate", required=True, help="path to the built //engine:generate")
    ap.add_argument("--max_tokens", type=int, default=12)
    args = ap.parse_args()
    torch.manual_seed(1234)
    failures = 0
    for dtype in ("float32", "bfloat16"):
        work = tempfile.mkdtemp(prefix=f"unseen_llama_{dtype}_")
        tok = train_tokenizer(700)
        vocab = tok.get_vocab_size()
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
        fast.save_pretrained(work)
        config = LlamaConfig(hidden_size=96, intermediate_size=200, num_hidden_layers=3,
                             num_attention_heads=6, num_key_value_heads=3, head_dim=16,
                             vocab_size=vocab, max_position_embeddings=512, rope_theta=50000.0,
                             rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1,
                             tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.08)
        model = model.to(getattr(torch, dtype)).eval()
        model.config.attn_implementation = "eager"
        model.save_pretrained(work)
        tol = 1e-3 if dtype == "float32" else 0.1
        for prompt in PROMPTS:
            ids = fast(prompt, add_special_tokens=False)["input_ids"]
            out = subprocess.run([args.generate, "--model", work, "--prompt_ids",
                                  ",".join(map(str, ids)), "--max_tokens", str(args.max_tokens),
                                  "--ignore_eos", "--json", "--logprobs", "5"],
                                 capture_output=True, text=True, check=True)
            got = json.loads(out.stdout)
            got_tokens = [s["token"] for s in got["steps"]]
            # The engine's own tokenizer on the text must give transformers' ids.
            enc = subprocess.run([args.generate, "--model", work, "--prompt", prompt,
                                  "--max_tokens", "1", "--json"],
                                 capture_output=True, text=True, check=True)
            engine_ids = json.loads(enc.stdout)["prompt_ids"]
            want_ids = fast(prompt)["input_ids"]  # with special tokens, as --prompt does
            if engine_ids != want_ids:
                failures += 1
                print(f"  tokenizer DIFFERENT: {engine_ids} vs {want_ids}")
            with torch.no_grad():
                seq = torch.tensor([ids])
                hf = model.generate(seq, max_new_tokens=args.max_tokens, do_sample=False,
                                    attention_mask=torch.ones_like(seq),
                                    pad_token_id=1, eos_token_id=None)
                want_tokens = hf[0, len(ids):].tolist()
                logits = model(hf[:, :-1]).logits.float()
            logp = torch.log_softmax(logits[0], dim=-1)
            max_err = 0.0
            for step, s in enumerate(got["steps"]):
                row = logp[len(ids) - 1 + step]
                for alt in s["top"]:
                    max_err = max(max_err, abs(alt["logprob"] - row[alt["token"]].item()))
            ok = got_tokens == want_tokens and max_err <= tol
            failures += not ok
            print(f"{dtype:9s} prompt {len(ids):3d} tokens: greedy "
                  f"{'identical' if got_tokens == want_tokens else 'DIFFERENT'}, "
                  f"max |logprob diff| {max_err:.2e} (tolerance {tol:g}) -> "
                  f"{'OK' if ok else 'FAIL'}")
            if got_tokens != want_tokens:
                print("  engine      ", got_tokens)
                print("  transformers", want_tokens)
    print("all OK" if failures == 0 else f"{failures} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
