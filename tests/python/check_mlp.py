#!/usr/bin/env python3
"""learned::Mlp against numpy: one forward pass, its backward pass (parameter and input gradients)
and Adam steps on the same gradient, for tanh and relu networks. Prints "mlp check: passed"."""
import json
import subprocess
import sys
import tempfile

import numpy as np


def unpack(sizes, params):
    layers, off = [], 0
    for i, o in zip(sizes[:-1], sizes[1:]):
        w = params[off:off + o * i].reshape(o, i)
        off += o * i
        b = params[off:off + o]
        off += o
        layers.append((w, b))
    return layers


def forward_backward(sizes, act, params, x, dy):
    layers = unpack(sizes, params)
    acts = [x]
    for k, (w, b) in enumerate(layers):
        z = acts[-1] @ w.T + b
        if k + 1 < len(layers):
            z = np.tanh(z) if act == "tanh" else np.maximum(z, 0)
        acts.append(z)
    grads = []
    delta = dy
    for k in reversed(range(len(layers))):
        w, _ = layers[k]
        if k + 1 < len(layers):
            a = acts[k + 1]
            delta = delta * ((1 - a * a) if act == "tanh" else (a > 0))
        grads.append((delta.T @ acts[k], delta.sum(axis=0)))
        delta = delta @ w
    flat = np.concatenate([np.concatenate([gw.ravel(), gb]) for gw, gb in reversed(grads)])
    return acts[-1], flat, delta


def adam(params, grad, lr, steps, b1=0.9, b2=0.999, eps=1e-8):
    m = np.zeros_like(params)
    v = np.zeros_like(params)
    p = params.copy()
    for t in range(1, steps + 1):
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad * grad
        p -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p


def main():
    tool = sys.argv[1]
    rng = np.random.default_rng(20261206)
    for act in ("tanh", "relu"):
        sizes = [19, 32, 16, 1]
        count = sum(o * (i + 1) for i, o in zip(sizes[:-1], sizes[1:]))
        params = rng.normal(0, 0.4, count)
        x = rng.normal(0, 1, (11, sizes[0]))
        dy = rng.normal(0, 1, (11, sizes[-1]))
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"sizes": sizes, "activation": act, "params": params.tolist(), "x": x.ravel().tolist(),
                       "dy": dy.ravel().tolist(), "lr": 0.01, "adam_steps": 3}, f)
        out = json.loads(subprocess.run([tool, f.name], check=True, capture_output=True, text=True).stdout)
        y, grad, dx = forward_backward(sizes, act, params, x, dy)
        after = adam(params, grad, 0.01, 3)
        for name, got, want in (("y", out["y"], y.ravel()), ("grad", out["grad"], grad), ("dx", out["dx"], dx.ravel()),
                                ("params_after", out["params_after"], after)):
            got = np.asarray(got)
            err = np.max(np.abs(got - want) / (np.abs(want) + 1e-9).clip(min=1.0))
            if got.shape != want.shape or err > 1e-10:
                sys.exit(f"mlp check ({act}): {name} differs from numpy by {err:.3g} (shapes {got.shape} vs {want.shape})")
        print(f"mlp check ({act}): y, gradients and 3 Adam steps match numpy")
    print("mlp check: passed")


if __name__ == "__main__":
    main()
