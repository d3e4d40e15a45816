#!/usr/bin/python3
"""gen_ops.py — PyTorch reference fixtures for the kernels in src/ops/.

Run from the repository root with Debian's python (it has torch):

    /usr/bin/python3 tests/ref/gen_ops.py

It writes tests/fixtures/ops_<op>.safetensors, read by tests/ops/test_ops.c.
Each file holds one or more cases; tensors are named "<case>.<tensor>":
inputs and parameters, a random upstream gradient `dout`, PyTorch's output
and gradients (`out`, `din`, `dw`, `db`, ...) and an I32 tensor `dims` with
the case's sizes in the order the C test reads them.

Precision: inputs, parameters and dout are drawn in float32 (the C kernels
see exactly these values); PyTorch then computes in float64 from them and the
results are rounded once to float32. The references are therefore the exact
answers to within half an fp32 ulp, and every difference the C test reports
is the fp32 rounding of the C kernel itself, not PyTorch's.

The safetensors format is written by hand (8-byte little-endian header
length, a JSON header, then raw little-endian data) so the fixtures do not
depend on the safetensors package. The header's __metadata__ carries
strata_fixture = "1", the fixture format version the test checks.
"""
import json
import os
import struct
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F

FIXTURE_VERSION = "1"
OUT_DIR = os.path.join("tests", "fixtures")


def write_safetensors(path, tensors, generator="tests/ref/gen_ops.py",
                      reference="float64 computation rounded to float32"):
    """tensors: list of (name, numpy array of float32 or int32); generator
    names the script in the file's metadata, reference says how the
    results were computed."""
    header = {
        "__metadata__": {
            "strata_fixture": FIXTURE_VERSION,
            "generator": generator,
            "torch": torch.__version__,
            "reference": reference,
        }
    }
    blobs, offset = [], 0
    for name, array in tensors:
        if array.dtype == np.float32:
            dtype, raw = "F32", array.astype("<f4").tobytes()
        elif array.dtype == np.int32:
            dtype, raw = "I32", array.astype("<i4").tobytes()
        else:
            raise TypeError(f"{name}: unsupported dtype {array.dtype}")
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # pad so the data section is 8-aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)
    return 8 + len(text) + offset


class Case:
    """Collects one case's tensors under a common prefix."""

    def __init__(self, name, out):
        self.name, self.out = name, out

    def f32(self, key, t):
        self.out.append((f"{self.name}.{key}",
                         t.detach().to(torch.float32).contiguous().numpy()))

    def i32(self, key, values):
        self.out.append((f"{self.name}.{key}",
                         np.asarray(values, dtype=np.int32).reshape(-1)))


def randn(*shape, scale=1.0):
    return torch.randn(*shape, dtype=torch.float32) * scale


def leaf(t):
    """float64 copy of a float32 tensor that records gradients."""
    return t.detach().to(torch.float64).requires_grad_(True)


def gen_linear():
    out = []
    for name, has_bias in (("bias", True), ("nobias", False)):
        B, IC, OC = 3, 7, 5
        x, w, b = randn(B, IC), randn(OC, IC, scale=0.4), randn(OC, scale=0.4)
        dout = randn(B, OC)
        xl, wl, bl = leaf(x), leaf(w), leaf(b)
        y = F.linear(xl, wl, bl if has_bias else None)
        y.backward(dout.to(torch.float64))
        c = Case(name, out)
        c.i32("dims", [B, IC, OC, int(has_bias)])
        for k, t in (("in", x), ("w", w), ("dout", dout), ("out", y),
                     ("din", xl.grad), ("dw", wl.grad)):
            c.f32(k, t)
        if has_bias:
            c.f32("b", b)
            c.f32("db", bl.grad)
    return out


def gen_relu():
    out = []
    x = randn(4, 25)
    x[0, :3] = torch.tensor([0.0, -0.0, 1e-30])  # the kink: grad 0 at 0
    dout = randn(4, 25)
    xl = leaf(x)
    y = F.relu(xl)
    y.backward(dout.to(torch.float64))
    c = Case("relu", out)
    c.i32("dims", [x.numel()])
    for k, t in (("in", x), ("dout", dout), ("out", y), ("din", xl.grad)):
        c.f32(k, t)
    return out


def gen_gelu():
    out = []
    for name, approximate in (("exact", "none"), ("tanh", "tanh")):
        x = randn(5, 40, scale=2.0)
        x[0, :6] = torch.tensor([0.0, -6.0, 6.0, -12.0, 12.0, 1e-4])
        dout = randn(5, 40)
        xl = leaf(x)
        y = F.gelu(xl, approximate=approximate)
        y.backward(dout.to(torch.float64))
        c = Case(name, out)
        c.i32("dims", [x.numel(), int(approximate == "tanh")])
        for k, t in (("in", x), ("dout", dout), ("out", y), ("din", xl.grad)):
            c.f32(k, t)
    return out


def gen_xent():
    out = []
    B, C = 6, 10
    logits = randn(B, C, scale=3.0)
    logits[1] += 40.0  # large logits: the max subtraction must hold
    labels = torch.randint(0, C, (B,))
    zl = leaf(logits)
    losses = F.cross_entropy(zl, labels, reduction="none")
    loss = losses.mean()
    loss.backward()
    c = Case("xent", out)
    c.i32("dims", [B, C])
    c.f32("logits", logits)
    c.i32("labels", labels.numpy())
    c.f32("losses", losses)
    c.f32("loss", loss.reshape(1))
    c.f32("probs", torch.softmax(logits.to(torch.float64), dim=1))
    c.f32("dlogits", zl.grad)
    return out


def gen_conv2d():
    out = []
    cases = (  # name, B, IC, H, W, OC, K, S, P, bias
        ("k3s1p1", 2, 3, 9, 9, 4, 3, 1, 1, True),
        ("k3s1p1_nobias", 2, 3, 9, 9, 4, 3, 1, 1, False),
        ("k3s1p1_b4", 4, 3, 9, 9, 4, 3, 1, 1, True),  # grouped dW path
        ("k5s2p2", 2, 3, 9, 9, 4, 5, 2, 2, True),
        ("k5s2p2_nobias", 2, 3, 9, 9, 4, 5, 2, 2, False),
        ("k3s2p0_rect", 2, 3, 9, 7, 4, 3, 2, 0, True),
        ("k1s1p0", 2, 3, 5, 6, 4, 1, 1, 0, True),
    )
    for name, B, IC, H, W, OC, K, S, P, has_bias in cases:
        x = randn(B, IC, H, W)
        w = randn(OC, IC, K, K, scale=1.0 / (IC * K * K) ** 0.5)
        b = randn(OC, scale=0.3)
        xl, wl, bl = leaf(x), leaf(w), leaf(b)
        y = F.conv2d(xl, wl, bl if has_bias else None, stride=S, padding=P)
        dout = randn(*y.shape)
        y.backward(dout.to(torch.float64))
        c = Case(name, out)
        c.i32("dims", [B, IC, H, W, OC, K, S, P, int(has_bias)])
        for k, t in (("in", x), ("w", w), ("dout", dout), ("out", y),
                     ("din", xl.grad), ("dw", wl.grad)):
            c.f32(k, t)
        if has_bias:
            c.f32("b", b)
            c.f32("db", bl.grad)
    return out


def gen_maxpool():
    out = []
    cases = (  # name, B, C, H, W, K, S, integer-valued input (ties)
        ("k2s2", 2, 3, 8, 8, 2, 2, False),
        ("k3s2", 2, 3, 9, 9, 3, 2, False),
        ("k2s2_ties", 2, 3, 8, 8, 2, 2, True),
        ("k3s2_ties", 2, 3, 9, 9, 3, 2, True),
    )
    for name, B, C, H, W, K, S, ties in cases:
        x = torch.randint(-1, 2, (B, C, H, W)).float() if ties else randn(B, C, H, W)
        xl = leaf(x)
        y, idx = F.max_pool2d(xl, K, S, return_indices=True)
        dout = randn(*y.shape)
        y.backward(dout.to(torch.float64))
        c = Case(name, out)
        c.i32("dims", [B, C, H, W, K, S])
        for k, t in (("in", x), ("dout", dout), ("out", y), ("din", xl.grad)):
            c.f32(k, t)
        c.i32("idx", idx.numpy())
    return out


def gen_avgpool():
    out = []
    for name, B, C, H, W, K, S in (("k2s2", 2, 3, 8, 8, 2, 2),
                                   ("k3s2", 2, 3, 9, 9, 3, 2)):
        x = randn(B, C, H, W)
        xl = leaf(x)
        y = F.avg_pool2d(xl, K, S)
        dout = randn(*y.shape)
        y.backward(dout.to(torch.float64))
        c = Case(name, out)
        c.i32("dims", [B, C, H, W, K, S])
        for k, t in (("in", x), ("dout", dout), ("out", y), ("din", xl.grad)):
            c.f32(k, t)
    return out


def stats(x64, dims, eps):
    mean = x64.mean(dim=dims)
    var = x64.var(dim=dims, unbiased=False)
    return mean, 1.0 / torch.sqrt(var + eps)


def gen_layernorm():
    out = []
    eps = 1e-5
    for name, N, D, offset in (("plain", 4, 10, 0.0), ("offset", 3, 16, 64.0)):
        # offset: a mean 64x the spread tests the two-pass statistics and the
        # backward's refinement of the fp32 mean it is handed
        x = randn(N, D) + offset
        w, b = 1.0 + randn(D, scale=0.3), randn(D, scale=0.3)
        dout = randn(N, D)
        xl, wl, bl = leaf(x), leaf(w), leaf(b)
        y = F.layer_norm(xl, (D,), wl, bl, eps)
        y.backward(dout.to(torch.float64))
        mean, rstd = stats(x.to(torch.float64), (1,), eps)
        c = Case(name, out)
        c.i32("dims", [N, D])
        c.f32("eps", torch.tensor([eps]))
        for k, t in (("in", x), ("w", w), ("b", b), ("dout", dout), ("out", y),
                     ("mean", mean), ("rstd", rstd), ("din", xl.grad),
                     ("dw", wl.grad), ("db", bl.grad)):
            c.f32(k, t)
    return out


def gen_groupnorm():
    out = []
    eps = 1e-5
    for name, B, C, H, W, G in (("g2", 2, 6, 3, 3, 2), ("gc", 2, 6, 3, 3, 6),
                                ("g1", 3, 4, 2, 5, 1)):
        x = randn(B, C, H, W) + 1.5
        w, b = 1.0 + randn(C, scale=0.3), randn(C, scale=0.3)
        dout = randn(B, C, H, W)
        xl, wl, bl = leaf(x), leaf(w), leaf(b)
        y = F.group_norm(xl, G, wl, bl, eps)
        y.backward(dout.to(torch.float64))
        mean, rstd = stats(x.to(torch.float64).reshape(B, G, -1), (2,), eps)
        c = Case(name, out)
        c.i32("dims", [B, C, H * W, G])
        c.f32("eps", torch.tensor([eps]))
        for k, t in (("in", x), ("w", w), ("b", b), ("dout", dout), ("out", y),
                     ("mean", mean), ("rstd", rstd), ("din", xl.grad),
                     ("dw", wl.grad), ("db", bl.grad)):
            c.f32(k, t)
    return out


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    total = 0
    for op, gen in (("linear", gen_linear), ("relu", gen_relu),
                    ("gelu", gen_gelu), ("xent", gen_xent),
                    ("conv2d", gen_conv2d), ("maxpool", gen_maxpool),
                    ("avgpool", gen_avgpool), ("layernorm", gen_layernorm),
                    ("groupnorm", gen_groupnorm)):
        # One seed per op, so a case added to one op leaves the others'
        # fixtures byte for byte the same.
        torch.manual_seed(zlib.crc32(op.encode("ascii")))
        path = os.path.join(OUT_DIR, f"ops_{op}.safetensors")
        size = write_safetensors(path, gen())
        total += size
        print(f"{path}: {size} bytes")
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
