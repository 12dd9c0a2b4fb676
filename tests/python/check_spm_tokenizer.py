#!/usr/bin/env python3
"""kvsim's SentencePiece tokenizer (Gemma 3) against Google's sentencepiece library, exactly. The
library gets a model built from the GGUF's own vocabulary (pieces, scores, types: BPE with byte
fallback, no dummy prefix, spaces escaped as U+2581; user-defined pieces re-escaped as the original
model held them), so both tokenize with the same vocabulary by independent code. Texts cover prose, code, numbers, whitespace runs, accents, CJK, emoji and bytes
that no piece holds; chat prompts put the control tokens around sentencepiece's own ids.

Usage: check_spm_tokenizer.py KVSIM GEMMA.gguf
"""
import json
import subprocess
import sys

import sentencepiece as spm
from gguf import GGUFReader
from sentencepiece import sentencepiece_model_pb2 as pb

TEXTS = [
    "Hello world, this is a test of Gemma's tokenizer.",
    "  leading spaces, trailing spaces   ",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Numbers: 3.14159, 2,718, 1e-9, 0x7F, 123456789012345.",
    "Café, naïve, résumé — Ελληνικά, русский, 日本語のテキスト, 한국어, العربية.",
    "Emoji 🙂🚀👩🏽‍💻 and symbols ∑∫√∞ ≠ ≤ ≥.",
    "Tabs\tand\r\nwindows line ends\n\n\nand blank lines.",
    "The secret code is 7421. Remember it well.\n\nWhat is the secret code?",
    "<html><body><div class=\"x\">tags</div></body></html>",
    "\x01\x02 control bytes \x7f",
]


def sp_model(gguf_path):
    f = GGUFReader(gguf_path).fields
    toks, scores, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.scores"], f["tokenizer.ggml.token_type"]
    kinds = {1: pb.ModelProto.SentencePiece.NORMAL, 2: pb.ModelProto.SentencePiece.UNKNOWN,
             3: pb.ModelProto.SentencePiece.CONTROL, 4: pb.ModelProto.SentencePiece.USER_DEFINED,
             5: pb.ModelProto.SentencePiece.UNUSED, 6: pb.ModelProto.SentencePiece.BYTE}
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    for key, attr in (("unknown", "unk_id"), ("bos", "bos_id"), ("eos", "eos_id"), ("padding", "pad_id")):
        setattr(m.trainer_spec, attr, int(f[f"tokenizer.ggml.{key}_token_id"].contents()))
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = bool(f["tokenizer.ggml.add_space_prefix"].contents())
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for i in range(len(toks.data)):
        p = m.pieces.add()
        p.piece = bytes(toks.parts[toks.data[i]]).decode("utf8")
        p.score = float(scores.parts[scores.data[i]][0])
        p.type = kinds[int(types.parts[types.data[i]][0])]
        if p.type == pb.ModelProto.SentencePiece.USER_DEFINED:
            # llama.cpp's converter writes user-defined pieces with plain spaces (matched on raw
            # text); sentencepiece matches them after escaping spaces, as the original model held them.
            p.piece = p.piece.replace(" ", "\u2581")
    return spm.SentencePieceProcessor(model_proto=m.SerializeToString())


def kvsim_ids(kvsim, model, text, *flags):
    out = subprocess.run([kvsim, "model", "tokenize", model, "--text", text, *flags], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    kvsim, model = sys.argv[1], sys.argv[2]
    sp = sp_model(model)
    failures = 0
    for t in TEXTS:
        want = sp.encode(t)
        got = kvsim_ids(kvsim, model, t, "--no-special")
        ok = got["ids"] == want and got["decoded"] == t
        print(f"{'ok  ' if ok else 'FAIL'} {len(want):3d} ids  {t[:50]!r}")
        if not ok:
            print("   sentencepiece:", want, "\n   kvsim:        ", got["ids"], "\n   decoded:", repr(got["decoded"]))
            failures += 1
    sot, eot, bos = sp.piece_to_id("<start_of_turn>"), sp.piece_to_id("<end_of_turn>"), sp.piece_to_id("<bos>")
    for t in TEXTS[:3]:
        want = [bos, sot] + sp.encode("user\n" + t) + [eot] + sp.encode("\n") + [sot] + sp.encode("model\n")
        got = kvsim_ids(kvsim, model, t, "--chat")["ids"]
        if got != want:
            print(f"FAIL chat prompt {t[:40]!r}:\n   want {want}\n   got  {got}")
            failures += 1
    print("spm tokenizer check:", "passed" if failures == 0 else f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
