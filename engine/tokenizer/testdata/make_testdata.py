#!/usr/bin/env python3
"""Generates the tokenizer's own sentencepiece-style fixtures with Hugging Face `tokenizers`.

engine/testdata/tokenizers holds the byte-level BPE fixtures (gpt2, llama3, qwen2). This script
adds the other family the tokenizer supports, byte-fallback BPE over "▁" word boundaries, in
two configurations:

  mistral/    Mistral/Llama-2 legacy style: normalizer Prepend("▁") + Replace(" ", "▁"), no
              pre-tokenizer, byte_fallback + fuse_unk, decoder Replace + ByteFallback + Fuse +
              Strip, <s> template; plus [INST]/[/INST] specials and a normalized added token.
  metaspace/  Metaspace pre-tokenizer (prepend_scheme "first", split), decoder ByteFallback +
              Metaspace; added tokens with lstrip/rstrip and single_word.

Each directory gets tokenizer.json, tokenizer_config.json and cases.json in the format of
engine/testdata/tokenizers (cases with ids / ids_with_special / decoded / decoded_skip_special,
and partial_decode_cases), computed with the `tokenizers` library itself.

Usage (tokenizers==0.23.3): python3 engine/tokenizer/testdata/make_testdata.py
"""

import json
import os
import pathlib
import sysconfig

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers  # noqa: E402
from tokenizers import pre_tokenizers, processors, trainers  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])
CORPUS_FILES = ["textwrap.py", "string.py", "heapq.py", "bisect.py", "shlex.py"]
SPECIALS = ["<unk>", "<s>", "</s>"]

TEST_STRINGS = [
    "", " ", "a", "Hello world", " Hello world", "  two leading", "trailing  ",
    "Hello, world! How are you doing today?",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "tabs\tbetween\twords", "line one\nline two\r\nline three",
    "12345678901234567890", "3.14159 2,718",
    "你好，世界！今天天气很好。", "안녕하세요 세계", "Привет, мир!",
    "😀😂🤖 rocket 🚀", "café naïve résumé", "é combining", "\x00\x01 control \x7f",
    "[INST] What is 2+2? [/INST] 4</s>", "<s>[INST] hi [/INST]", "[INST][INST]",
    "say my token twice: my token my token", "my token", "my  token",
    "call <tool> now", "call   <tool>   now", "<tool>", "a <sep> b", "a<sep>b", "<sep>",
    "▁already▁has▁metaspace", "▁", "▁▁x",
]

PARTIAL_DECODE_STRINGS = ["你好，世界！", "😀 ok 🚀", "naïve café"]


def corpus_lines():
    for name in CORPUS_FILES:
        for line in (STDLIB / name).read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield line
    yield "你好 世界 안녕 Привет мир café"


def train(vocab_size):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  limit_alphabet=80, show_progress=False)
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    return json.loads(tok.to_str())


def with_byte_tokens(data):
    """Puts <0x00>..<0xFF> right after the specials, as sentencepiece vocabularies have them."""
    vocab = data["model"]["vocab"]
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    new_vocab = {}
    for token, _ in ordered[:len(SPECIALS)]:
        new_vocab[token] = len(new_vocab)
    for b in range(256):
        new_vocab["<0x%02X>" % b] = len(new_vocab)
    for token, _ in ordered[len(SPECIALS):]:
        if token not in new_vocab:
            new_vocab[token] = len(new_vocab)
    data["model"]["vocab"] = new_vocab
    for t in data["added_tokens"]:
        t["id"] = new_vocab[t["content"]]
    return data


def build(flavour):
    data = with_byte_tokens(train(600))
    tok = Tokenizer.from_str(json.dumps(data))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    if flavour == "mistral":
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = None
        tok.decoder = decoders.Sequence([
            decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0)])
        tok.add_special_tokens([AddedToken("[INST]", normalized=False),
                                AddedToken("[/INST]", normalized=False)])
        tok.add_tokens([AddedToken("my token", normalized=True, special=False)])
    else:
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first", split=True)
        tok.decoder = decoders.Sequence(
            [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")])
        tok.add_tokens([AddedToken("<tool>", lstrip=True, rstrip=True, normalized=False,
                                   special=False)])
        tok.add_special_tokens([AddedToken("<sep>", single_word=True, normalized=False)])
    return tok


def cases(tok):
    out = []
    for text in TEST_STRINGS:
        ids = tok.encode(text, add_special_tokens=False).ids
        out.append({
            "text": text,
            "ids": ids,
            "ids_with_special": tok.encode(text, add_special_tokens=True).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    partial = []
    for text in PARTIAL_DECODE_STRINGS:
        ids = tok.encode(text, add_special_tokens=False).ids
        for end in range(1, len(ids) + 1):
            partial.append({"ids": ids[:end], "decoded": tok.decode(ids[:end])})
    return {"cases": out, "partial_decode_cases": partial}


def main():
    for flavour in ("mistral", "metaspace"):
        tok = build(flavour)
        out = HERE / flavour
        out.mkdir(exist_ok=True)
        # Round trip through the file so the cases come from what the C++ side loads.
        (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                  "add_bos_token": True, "add_eos_token": False,
                  "generated_with": "tokenizers " + tokenizers.__version__}
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
        with open(out / "cases.json", "w", encoding="utf-8") as f:
            json.dump(cases(tok), f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{flavour}: {tok.get_vocab_size()} tokens")


if __name__ == "__main__":
    main()
