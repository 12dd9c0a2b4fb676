#!/usr/bin/env python3
"""kvsim's byte-level BPE tokenizer against Hugging Face `tokenizers` built from the same GGUF
vocabulary and merges with SmolLM2's pre-tokenizer (digits one by one, then GPT-2 byte-level),
on a corpus with Unicode, digits, whitespace runs, code and control tokens."""
import json
import os
import subprocess
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CORPUS = [
    "Hello world!",
    "The year 2024 had 366 days; 3.14159 is pi.",
    "don't I'll we've they're she'd it's",
    "    four leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nthree",
    "def f(x):\n    return x**2 + 1  # comment\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "¡Olé! Ça va? naïve café Straße",
    "你好，世界。こんにちは。안녕하세요",
    "emoji 😀👍🏽 and symbols ©®™ ∑∫√",
    "مرحبا بالعالم",
    "Ελληνικά και кириллица",
    "numbers: 1,000,000 and 1e-5 and ²³ and Ⅻ",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> inside",
    "a" * 300,
    "mixed\r\nline\rendings",
    "   ",
    "\n",
    "x",
    "URL https://example.com/path?q=1&r=2#frag",
    "JSON {\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
]


def hf_tokenizer(path):
    r = GGUFReader(path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty in (3, 4)])
    return tk


def main():
    kvsim, workdir, model = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(workdir, exist_ok=True)
    if not os.path.exists(model):
        print(f"FAIL: {model} is missing: run scripts/setup.sh, which fetches it")
        print("tokenizer check: 0 passed, 1 failed")
        return 1
    tk = hf_tokenizer(model)
    failures = []
    for i, text in enumerate(CORPUS):
        path = os.path.join(workdir, f"tok_{i}.txt")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        out = subprocess.run([kvsim, "model", "tokenize", model, "--text-file", path],
                             check=True, capture_output=True, text=True)
        got = json.loads(out.stdout)
        want = tk.encode(text).ids
        if got["ids"] != want:
            failures.append(f"{text!r}: kvsim {got['ids'][:20]} vs HF {want[:20]}")
        if got["decoded"] != text:
            failures.append(f"{text!r}: decodes to {got['decoded']!r}")
    for f in failures:
        print("FAIL:", f)
    print(f"tokenizer check: {len(CORPUS) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
