#!/usr/bin/python3
"""gen_bf16.py — PyTorch's CPU bf16 autocast on the products strata runs in
bf16 (train.precision: bf16), for tests/ops/test_ops_bf16.c.

Run from the repository root with Debian's python (it has torch):

    /usr/bin/python3 tests/ref/gen_bf16.py

It writes tests/fixtures/ops_bf16_autocast.safetensors. Under
torch.autocast("cpu", dtype=torch.bfloat16) a linear layer and a matmul
round their inputs to bf16, multiply with fp32 sums (oneDNN) and return
bf16; their gradients are bf16 products too. The file keeps the fp32
inputs (which strata's kernels see), the upstream gradient, and PyTorch's
results widened to float32 (exactly: every bf16 value is an fp32 value).

The linear layer has no bias: autocast rounds the bias to bf16 as well,
where strata keeps it in fp32 and starts each output's sum from it
(docs/bf16.md), so the two differ there by design.
"""
import os
import sys
import zlib

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_ops  # noqa: E402  (the fixture writer and its version)
from gen_ops import Case, randn  # noqa: E402

REFERENCE = "torch.autocast('cpu', bfloat16) results, bf16 widened to float32"


def autocast_case(out, name, x, w, dy, f, dims):
    """f(x, w) under autocast, backward with dy; records the case."""
    xl, wl = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = f(xl, wl)
    assert y.dtype == torch.bfloat16, "autocast did not run in bf16"
    y.backward(dy.to(torch.bfloat16))
    c = Case(name, out)
    c.i32("dims", dims)
    for k, t in (("in", x), ("w", w), ("dout", dy), ("out", y),
                 ("din", xl.grad), ("dw", wl.grad)):
        c.f32(k, t)


def gen():
    out = []
    # a linear layer, W (OC, IC): out = in W^T
    B, IC, OC = 16, 96, 40
    autocast_case(out, "linear", randn(B, IC), randn(OC, IC, scale=0.3),
                  randn(B, OC), lambda x, w: F.linear(x, w), [B, IC, OC])
    # a matmul with K past strata's K block (512): out = in W, W (K, N)
    M, K, N = 8, 600, 24
    autocast_case(out, "matmul", randn(M, K), randn(K, N, scale=0.1),
                  randn(M, N), lambda x, w: x @ w, [M, K, N])
    return out


def main():
    os.makedirs(gen_ops.OUT_DIR, exist_ok=True)
    torch.manual_seed(zlib.crc32(b"bf16_autocast"))
    path = os.path.join(gen_ops.OUT_DIR, "ops_bf16_autocast.safetensors")
    size = gen_ops.write_safetensors(path, gen(),
                                     generator="tests/ref/gen_bf16.py",
                                     reference=REFERENCE)
    print(f"{path}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
