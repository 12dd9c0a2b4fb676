#!/usr/bin/env python3
"""kvsim's CPU prefill and decode beside llama.cpp's on the same GGUF, same machine, same thread
count, measured alternately in one run (issue 28): tokens/s of the prefill of 128 and 1024 tokens
and of 128 greedy steps after it, and their ratios (targets: decode >= 1.0x, prefill >= 1.5x).
llama.cpp runs through llama-cpp-python, which `--install` puts into this Python with pip (it
builds llama.cpp from source: about 6 minutes on 2 cores).

usage: decode_vs_llamacpp.py MODEL.gguf [--install] [--bench build/bench/bench_capture] [--threads 2] [--rounds 2]
"""
import argparse
import re
import subprocess
import sys
import time


def kvsim_speeds(bench, model):
    """{context: (prefill tokens/s, decode tokens/s)} from bench_capture --decode-only."""
    out = subprocess.run([bench, "--model", model, "--decode-only"], check=True, capture_output=True, text=True).stdout
    pat = r"prefill of\s+(\d+) tokens:\s+([\d.]+) tokens/s; decode after\s+\d+ tokens:\s+([\d.]+)"
    return {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in re.finditer(pat, out)}


def llamacpp_speeds(llm, contexts, steps=128):
    """Best of two: the prefill of n tokens and `steps` greedy tokens after it (prompt ids cycled)."""
    base = llm.tokenize(b"The quick brown fox jumps over the lazy dog. " * 200)
    out = {}
    for n in contexts:
        prompt = (base * (n // len(base) + 1))[:n]
        best, best_prefill = float("inf"), float("inf")
        for _ in range(2):
            llm.reset()
            tp = time.perf_counter()
            llm.eval(prompt)
            best_prefill = min(best_prefill, time.perf_counter() - tp)
            t0 = time.perf_counter()
            for _ in range(steps):
                tok = llm.sample(top_k=1)
                llm.eval([tok])
            best = min(best, time.perf_counter() - t0)
        out[n] = (n / best_prefill, steps / best)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--bench", default="build/bench/bench_capture")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--install", action="store_true", help="pip-install llama-cpp-python first when it is missing")
    a = p.parse_args()
    if a.install:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "llama-cpp-python"], check=True)
    try:
        from llama_cpp import Llama
    except ImportError:
        print("decode vs llama.cpp: skipped (llama-cpp-python is not installed in this Python)")
        return 0
    llm = Llama(model_path=a.model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=2048, n_batch=512,
                verbose=False)
    contexts = [128, 1024]
    print(f"{a.model}: decode tokens/s, {a.threads} threads, alternating rounds")
    ratios = {(n, k): [] for n in contexts for k in (0, 1)}
    for r in range(a.rounds):
        ours = kvsim_speeds(a.bench, a.model)
        theirs = llamacpp_speeds(llm, contexts)
        for n in contexts:
            for k, what in ((0, "prefill"), (1, "decode ")):
                ratios[(n, k)].append(ours[n][k] / theirs[n][k])
                print(f"round {r + 1}: {what} {n:4d} tokens: kvsim {ours[n][k]:7.1f}, llama.cpp {theirs[n][k]:7.1f} "
                      f"tokens/s, ratio {ours[n][k] / theirs[n][k]:.2f}")
    for n in contexts:
        for k, what, target in ((0, "prefill of", 1.5), (1, "decode after", 1.0)):
            lo, hi = min(ratios[(n, k)]), max(ratios[(n, k)])
            print(f"{what} {n:4d} tokens: kvsim / llama.cpp = {lo:.2f}-{hi:.2f} (target >= {target}) "
                  f"{'OK' if lo >= target else 'BELOW TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
