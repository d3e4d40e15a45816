#!/usr/bin/python3
"""Reads a strata MLP checkpoint with nothing but json + numpy (following the
safetensors specification: 8-byte little-endian header length, JSON header,
data ranges that tile the data section), loads it into the equivalent
PyTorch model and prints its Fashion-MNIST test accuracy, to compare with
`strata eval` on the same file. Proves the files are usable outside strata.

Usage: /usr/bin/python3 tests/ref/check_checkpoint.py CHECKPOINT HIDDEN...
(pixels standardised with the training set's mean and std, as strata does)
"""
import gzip
import json
import struct
import sys

import numpy as np
import torch

DATA = "/usr/share/datasets/fashion-mnist"


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1]) for v in header.values())
    at = 0
    for begin, end in spans:  # the ranges tile the data section
        assert begin == at, (begin, at)
        at = end
    assert at == len(data), (at, len(data))
    dtypes = {"F32": np.float32, "I32": np.int32}
    tensors = {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]],
                                dtypes[v["dtype"]]).reshape(v["shape"])
               for k, v in header.items()}
    return tensors, meta


def idx(name, offset):
    return np.frombuffer(gzip.open(f"{DATA}/{name}").read(), np.uint8, offset=offset)


def main():
    tensors, meta = read_safetensors(sys.argv[1])
    widths = [int(w) for w in sys.argv[2:]] + [10]
    layers, fan_in = [torch.nn.Flatten()], 784
    for i, w in enumerate(widths):
        lin = torch.nn.Linear(fan_in, w)
        lin.weight.data = torch.from_numpy(tensors[f"blocks.{i}.linear0.weight"].copy())
        lin.bias.data = torch.from_numpy(tensors[f"blocks.{i}.linear0.bias"].copy())
        layers += [lin] + ([torch.nn.ReLU()] if i < len(widths) - 1 else [])
        fan_in = w
    model = torch.nn.Sequential(*layers)
    train = idx("train-images-idx3-ubyte.gz", 16).astype(np.float64) / 255.0
    mean, std = train.mean(), train.std()
    x = (idx("t10k-images-idx3-ubyte.gz", 16).astype(np.float32) / np.float32(255.0)
         - np.float32(mean)) / np.float32(std)
    y = idx("t10k-labels-idx1-ubyte.gz", 8)
    with torch.no_grad():
        pred = model(torch.from_numpy(x.reshape(-1, 1, 28, 28))).argmax(1).numpy()
    print(f"metadata step {meta.get('step')}, optimizer {meta.get('optimizer')}; "
          f"{len(tensors)} tensors; torch test accuracy {(pred == y).mean():.4f}")


if __name__ == "__main__":
    main()
