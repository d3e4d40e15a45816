#!/usr/bin/python3
"""gen_gpt_ops.py — PyTorch reference fixtures for the GPT kernels in
src/ops/embedding.c and src/ops/attention.c.

Run from the repository root with Debian's python (it has torch):

    /usr/bin/python3 tests/ref/gen_gpt_ops.py

It writes tests/fixtures/ops_embedding.safetensors and
ops_attention.safetensors (attention and rotary cases), read by
tests/ops/test_gpt_ops.c. The format, the naming ("<case>.<tensor>", an I32
`dims` tensor with the case's sizes) and the precision rule are those of
gen_ops.py: inputs and dout are drawn in float32, PyTorch computes in float64
from them and the results are rounded once to float32, so every difference
the C test reports is the C kernel's own fp32 rounding.
"""
import math
import os
import sys
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_ops  # noqa: E402
from gen_ops import Case, leaf, randn  # noqa: E402  (same helpers, same rules)

FIXTURE_VERSION = "1"
OUT_DIR = os.path.join("tests", "fixtures")


def write_safetensors(path, tensors):
    """gen_ops.py's writer, with this script named as the generator."""
    return gen_ops.write_safetensors(path, tensors, "tests/ref/gen_gpt_ops.py")


def gen_embedding():
    out = []
    B, T, C, V, T_max = 2, 5, 6, 11, 7  # wpe rows T..T_max-1 get no gradient
    # Repeats within and across sequences, so dwte rows sum several dout rows.
    tokens = torch.tensor([[3, 7, 3, 0, 10], [7, 7, 1, 3, 10]], dtype=torch.int64)
    for name, has_wpe in (("learned", True), ("nowpe", False)):
        wte, wpe = randn(V, C, scale=0.5), randn(T_max, C, scale=0.5)
        dout = randn(B, T, C)
        wtel, wpel = leaf(wte), leaf(wpe)
        y = wtel[tokens]
        if has_wpe:
            y = y + wpel[:T].unsqueeze(0)
        y.backward(dout.to(torch.float64))
        c = Case(name, out)
        c.i32("dims", [B, T, C, V, T_max, int(has_wpe)])
        c.i32("tokens", tokens.numpy())
        for k, t in (("wte", wte), ("wpe", wpe), ("dout", dout), ("out", y),
                     ("dwte", wtel.grad)):
            c.f32(k, t)
        if has_wpe:
            c.f32("dwpe", wpel.grad)
    return out


def attention_reference(qkv, NH):
    """Causal self-attention core as written in the GPT-2 / nanoGPT model:
    qkv (B, T, 3C) -> y (B, T, C) and att (B, NH, T, T)."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // NH
    q, k, v = qkv.split(C, dim=2)
    q, k, v = (x.view(B, T, NH, hs).transpose(1, 2) for x in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(hs)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    att = torch.softmax(scores, dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    return y, att


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary_reference(qkv, NH, rotary_dim, base=10000.0):
    """GPT-NeoX rotary (Hugging Face GPTNeoXAttention): on the first
    rotary_dim dims of every head of q and k, x * cos + rotate_half(x) * sin
    with theta[t, i] = t * base^(-2i / rotary_dim), cos/sin of cat(theta,
    theta). v and the remaining dims pass through."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // NH
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2,
                                            dtype=torch.float64) / rotary_dim))
    theta = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((theta, theta), dim=-1)  # (T, rotary_dim)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    q, k, v = qkv.split(C, dim=2)

    def rope(x):
        x = x.view(B, T, NH, hs)
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        rot = rot * cos + rotate_half(rot) * sin
        return torch.cat((rot, rest), dim=-1).reshape(B, T, C)

    return torch.cat((rope(q), rope(k), v), dim=2)


def gen_attention():
    out = []
    for name, B, T, C, NH in (("small", 2, 7, 12, 3), ("long", 1, 16, 16, 4)):
        qkv = randn(B, T, 3 * C)
        dout = randn(B, T, C)
        ql = leaf(qkv)
        y, att = attention_reference(ql, NH)
        y.backward(dout.to(torch.float64))
        c = Case(name, out)
        c.i32("dims", [B, T, C, NH])
        for k, t in (("qkv", qkv), ("dout", dout), ("out", y), ("att", att),
                     ("dqkv", ql.grad)):
            c.f32(k, t)
    # rotary: hs = 8; full and half rotary_dim; T = 9 turns pair 0 by up to
    # 8 rad, past 2 pi
    for name, rotary_dim in (("rotary_full", 8), ("rotary_half", 4)):
        B, T, C, NH = 2, 9, 16, 2
        qkv = randn(B, T, 3 * C)
        dout = randn(B, T, 3 * C)
        ql = leaf(qkv)
        y = rotary_reference(ql, NH, rotary_dim)
        y.backward(dout.to(torch.float64))
        c = Case(name, out)
        c.i32("dims", [B, T, C, NH, rotary_dim])
        for k, t in (("qkv", qkv), ("dout", dout), ("out", y),
                     ("dqkv", ql.grad)):
            c.f32(k, t)
    return out


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    total = 0
    for op, gen in (("embedding", gen_embedding), ("attention", gen_attention)):
        torch.manual_seed(zlib.crc32(op.encode("ascii")))
        path = os.path.join(OUT_DIR, f"ops_{op}.safetensors")
        size = write_safetensors(path, gen())
        total += size
        print(f"{path}: {size} bytes")
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
