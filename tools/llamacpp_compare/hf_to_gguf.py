#!/usr/bin/env python3
"""Writes a GGUF (llama architecture, BF16 weights) of a Hugging Face Llama checkpoint.

Usage: hf_to_gguf.py --llama_cpp DIR --model HF_DIR --out FILE.gguf

Uses the `gguf` package that ships in the llama.cpp tree (DIR/gguf-py) and numpy; no torch.
Weights are copied bit for bit (bf16 stays bf16; norms are widened to f32 as llama.cpp's own
converter stores them). Q and K projection rows are permuted from Hugging Face's rotate-half
RoPE layout to llama.cpp's interleaved one (the permutation convert_hf_to_gguf.py applies for
the `llama` architecture); without it llama.cpp's logits silently differ.

The vocabulary is a placeholder SentencePiece-style list of config.vocab_size entries (<unk>,
<s>, </s>, 256 byte tokens, then filler pieces): the throughput benchmarks feed token ids, never
text. Only dense Llama-family checkpoints (LlamaForCausalLM, MistralForCausalLM without sliding
windows) are supported.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(model_dir):
    """Yields (name, dtype string, shape, raw bytes) for every tensor in the checkpoint."""
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        sys.exit(f"{model_dir}: no *.safetensors files")
    for fname in files:
        with open(os.path.join(model_dir, fname), "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
            base = 8 + header_len
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                f.seek(base + start)
                yield name, info["dtype"], info["shape"], f.read(end - start)


def as_bf16_bits(dtype, shape, raw):
    """The tensor as uint16 bf16 bit patterns."""
    if dtype == "BF16":
        return np.frombuffer(raw, dtype=np.uint16).reshape(shape)
    if dtype == "F32":
        bits = np.frombuffer(raw, dtype=np.uint32).reshape(shape)
        # Round to nearest even, as torch does.
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        return (rounded >> 16).astype(np.uint16)
    sys.exit(f"unsupported dtype {dtype}; expected BF16 or F32")


def as_f32(dtype, shape, raw):
    if dtype == "BF16":
        u16 = np.frombuffer(raw, dtype=np.uint16).reshape(shape)
        return (u16.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F32":
        return np.frombuffer(raw, dtype=np.float32).reshape(shape).copy()
    sys.exit(f"unsupported dtype {dtype}; expected BF16 or F32")


def permute_rows(w, n_head):
    """Hugging Face rotate-half row order -> llama.cpp interleaved pairs, per head."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama_cpp", required=True, help="llama.cpp source tree (for gguf-py)")
    ap.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    ap.add_argument("--out", required=True, help="output .gguf")
    ap.add_argument("--no_permute", action="store_true",
                    help="skip the Q/K permutation (only to demonstrate that it matters)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.llama_cpp, "gguf-py"))
    import gguf  # noqa: E402  (from the llama.cpp tree)

    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") not in ("llama", "mistral"):
        sys.exit(f"model_type {cfg.get('model_type')!r}: only llama/mistral are supported")
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    vocab = cfg["vocab_size"]

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name(os.path.basename(os.path.normpath(args.model)))
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

    tokens, scores, types = [], [], []
    specials = [("<unk>", gguf.TokenType.UNKNOWN), ("<s>", gguf.TokenType.CONTROL),
                ("</s>", gguf.TokenType.CONTROL)]
    for text, kind in specials:
        tokens.append(text.encode())
        scores.append(0.0)
        types.append(kind)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>".encode())
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    while len(tokens) < vocab:
        tokens.append(f"\u2581t{len(tokens)}".encode())
        scores.append(-float(len(tokens)))
        types.append(gguf.TokenType.NORMAL)
    if len(tokens) > vocab:
        sys.exit(f"vocab_size {vocab} is smaller than the {len(tokens)} fixed tokens")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(cfg.get("bos_token_id", 1) or 1)
    w.add_eos_token_id(cfg.get("eos_token_id", 2) or 2)

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    seen = set()
    for name, dtype, shape, raw in read_safetensors(args.model):
        if name in names:
            out = names[name]
        elif name.startswith("model.layers."):
            layer, rest = name[len("model.layers."):].split(".", 1)
            if rest not in per_layer:
                sys.exit(f"unexpected tensor {name}")
            out = f"blk.{layer}.{per_layer[rest]}"
        else:
            sys.exit(f"unexpected tensor {name}")
        seen.add(out)
        if len(shape) == 1:
            w.add_tensor(out, as_f32(dtype, shape, raw))
            continue
        bits = as_bf16_bits(dtype, shape, raw)
        if args.no_permute:
            pass
        elif name.endswith("q_proj.weight"):
            bits = permute_rows(bits, n_head)
        elif name.endswith("k_proj.weight"):
            bits = permute_rows(bits, n_kv)
        w.add_tensor(out, np.ascontiguousarray(bits), raw_dtype=gguf.GGMLQuantizationType.BF16)
    if "output.weight" not in seen and cfg.get("tie_word_embeddings", False) is False:
        sys.exit("checkpoint has no lm_head.weight and tie_word_embeddings is false")

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
