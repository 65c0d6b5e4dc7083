"""Shared pieces of the demo model training: corpus split, tokenizer, copy/edit task, configs.

Everything here is deterministic given its seed arguments.
"""

from __future__ import annotations

import json
import keyword
import pathlib
import random
import re
import textwrap

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

STDLIB_DIR = pathlib.Path("/usr/lib/python3.11")
LICENSE_FILE = STDLIB_DIR / "LICENSE.txt"
# Files never trained on: held-out loss, copy accuracy and agreement are measured on them.
HELD_OUT = (
    "bisect.py",
    "colorsys.py",
    "fnmatch.py",
    "glob.py",
    "graphlib.py",
    "heapq.py",
    "netrc.py",
    "sched.py",
    "shlex.py",
    "textwrap.py",
)
# Machine-generated files that are not representative Python source.
EXCLUDED = ("_sysconfigdata__linux_x86_64-linux-gnu.py", "_sysconfigdata__x86_64-linux-gnu.py")

VOCAB_SIZE = 4096
BOS = "<|endoftext|>"  # Also the document separator and the pad token.
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (BOS, IM_START, IM_END)

# Qwen2's pre-tokenizer split (every digit on its own).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = """{{- bos_token }}
{%- for message in messages %}
    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def corpus_files() -> tuple[list[pathlib.Path], list[pathlib.Path]]:
    """(train, held_out): the top-level stdlib modules, sorted by name."""
    files = sorted(p for p in STDLIB_DIR.glob("*.py") if p.name not in EXCLUDED)
    train = [p for p in files if p.name not in HELD_OUT]
    held = [p for p in files if p.name in HELD_OUT]
    if len(held) != len(HELD_OUT):
        raise RuntimeError(f"missing held-out files: {HELD_OUT} vs {[p.name for p in held]}")
    return train, held


def read(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8")


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size(True)} tokens, want {VOCAB_SIZE}")
    return tok


def wrap_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=2048,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=BOS,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


# ---------------------------------------------------------------------------------------------
# Copy/edit task
# ---------------------------------------------------------------------------------------------

IDENT_RE = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
NUMBER_RE = re.compile(r"(?<![\w.])\d+(?![\w.])")
NEW_NAMES = (
    "value", "item", "node", "entry", "result", "buf", "count", "total", "key", "name", "data",
    "obj", "text", "index", "size", "limit", "parts", "cache", "state", "token", "chunk", "path",
)


def snippet(rng: random.Random, text: str, min_lines: int = 4, max_lines: int = 10,
            max_chars: int = 480) -> str | None:
    lines = text.splitlines()
    if len(lines) < min_lines:
        return None
    n = rng.randint(min_lines, max_lines)
    start = rng.randrange(0, max(1, len(lines) - n))
    chunk = [l.rstrip() for l in lines[start:start + n]]
    while chunk and not chunk[0].strip():
        chunk.pop(0)
    while chunk and not chunk[-1].strip():
        chunk.pop()
    s = textwrap.dedent("\n".join(chunk))
    if len(chunk) < min_lines - 1 or len(s) > max_chars or len(s) < 40:
        return None
    return s


def make_edit(rng: random.Random, code: str) -> tuple[str, str] | None:
    """(instruction, edited code) for one small change to `code`, or None."""
    if rng.random() < 0.75:
        names = sorted({m.group(0) for m in IDENT_RE.finditer(code)
                        if len(m.group(0)) >= 3 and not keyword.iskeyword(m.group(0))})
        if not names:
            return None
        old = rng.choice(names)
        new = rng.choice(NEW_NAMES) + rng.choice(("", "_2", "_new", "s"))
        if new == old or re.search(rf"\b{re.escape(new)}\b", code):
            return None
        edited = re.sub(rf"\b{re.escape(old)}\b", new, code)
        return f"rename `{old}` to `{new}`.", edited
    nums = list(NUMBER_RE.finditer(code))
    if not nums:
        return None
    m = rng.choice(nums)
    old = m.group(0)
    new = str(rng.randint(0, 99))
    if new == old:
        return None
    first = next(x for x in nums if x.group(0) == old)
    edited = code[:first.start()] + new + code[first.end():]
    return f"change the first `{old}` to `{new}`.", edited


def copy_messages(code: str, instruction: str, edited: str | None = None) -> list[dict]:
    msgs = [{"role": "user", "content": f"{code}\n\nRewrite it with one change: {instruction}"}]
    if edited is not None:
        msgs.append({"role": "assistant", "content": edited})
    return msgs


def copy_examples(rng: random.Random, texts: list[str], n: int) -> list[tuple[str, str, str]]:
    """n (code, instruction, edited) triples drawn from `texts`."""
    out = []
    while len(out) < n:
        code = snippet(rng, rng.choice(texts))
        if code is None:
            continue
        edit = make_edit(rng, code)
        if edit is None:
            continue
        out.append((code, edit[0], edit[1]))
    return out


def write_json(path: pathlib.Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
