#!/usr/bin/python3
"""Writes tests/fixtures/pb_ref.safetensors: trajectories of pipelined
backpropagation on a 4-stage MLP, one per mitigation and micro-batch size,
computed by an implementation of its own (plain Python, float64).

Run: python3 tests/ref/gen_pb.py   (no packages beyond the standard library)

It follows ../shared/BACKGROUND.md section 2 and the papers, not the C code
(src/exec/pb.c, src/optim/optim.c), and it is written as a simulation of
the ticks rather than stage by stage:

  at tick t, stage s runs the forward of micro-batch t - s, then the
  backward of micro-batch t - 2 (S - 1) + s and the update with its
  gradient; the last stage forwards, takes the loss and backs the same
  micro-batch in one tick. D(s) = 2 (S - 1 - s) updates happen at stage s
  between a micro-batch's forward and its own update.

Each stage runs N = 60 pairs (forward of n, backward of n - D), as the C
executor does when it is fed N micro-batches; stage 0 (D = 6) updates 54
times. After stage s's pair n the fixture holds its weights:
<case>.<tensor> has shape [N, ...], row n the weights after pair n.

The model (strata: model.kind mlp, hidden [5, 4, 4], activation gelu,
classes 3, input 6 features; one block, so one stage, per layer):
  stage s < 3: a = gelu(W x + b)    stage 3: logits = W x + b,
  loss = mean over the micro-batch of softmax cross-entropy.
Gradients are those of that mean.

Optimizer: heavy-ball SGD, v <- m v + g, w <- w - lr v (lr 0.05, m 0.9,
no weight decay, no Nesterov), v starting at 0. Mitigations, per stage with
D = D(s):
  none      forward and backward on the live weights w
  stash     the backward on the weights its forward used
  sc        w <- w - lr (a v + b g), a = m^D, b = (1 - m^D) / (1 - m),
            v updated first (so the delayed gradient's first application
            is sum_{k<=D} m^k, what undelayed momentum would have applied
            by now, and its total stays lr / (1 - m))
  lwp       the forward on w - lr D v (the weights D updates ahead if v
            stayed as it is); the backward on w
  sc+lwp    both
  pipemare  the update's lr scaled by D^-(1 - min(t / T, 1)), t the
            stage's updates so far (T = 20); the backward on w - D delta,
            delta <- gamma delta + (1 - gamma) (w_new - w_old) after each
            update (gamma 0.5), starting at 0.
(spectrain's rule, forward on w - lr k v with k the updates still to come
and backward with k = 0 at the moment of the update, is lwp's in this
fine-grained pipeline, so strata does not offer it separately.)

Conditioning: a trajectory is only worth comparing against if rounding
does not grow along it. Each case is also run from initial weights moved
by a relative 2^-23 (a float32 ulp, pseudo-random signs); the largest
difference that makes over the whole trajectory is stored as metadata
cond.<case>, and the C test's tolerance must sit well above it
(tests/exec/test_pb_ref.c).
"""
import json
import math
import random
import struct
import sys

OUT = "tests/fixtures/pb_ref.safetensors"
SIZES = [6, 5, 4, 4, 3]  # input, hidden x 3, classes
S = len(SIZES) - 1
N = 60
LR, MOM = 0.05, 0.9
WARMUP, GAMMA = 20, 0.5
MITIGATIONS = ["none", "stash", "sc", "lwp", "sc+lwp", "pipemare"]
MICRO = [1, 2]
NAMES = [f"blocks.{s}.linear0" for s in range(S)]


def gelu(z):
    return 0.5 * z * (1.0 + math.erf(z / math.sqrt(2.0)))


def gelu_grad(z):
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))) + z * pdf


class Layer:
    """Stage s's parameters as one flat list: W (out x in, row-major), b."""

    def __init__(self, s):
        self.s, self.n_in, self.n_out = s, SIZES[s], SIZES[s + 1]
        self.size = self.n_out * self.n_in + self.n_out

    def split(self, p):
        k = self.n_out * self.n_in
        return p[:k], p[k:]

    def forward(self, p, xs):
        """xs: the micro-batch's inputs; returns outputs and what the
        backward needs."""
        W, b = self.split(p)
        outs, zs = [], []
        for x in xs:
            z = [b[o] + sum(W[o * self.n_in + i] * x[i]
                            for i in range(self.n_in))
                 for o in range(self.n_out)]
            zs.append(z)
            outs.append(z if self.s == S - 1 else [gelu(v) for v in z])
        return outs, (xs, zs)

    def backward(self, p, cache, douts):
        """Gradient of the parameters and of the inputs, given the
        gradient of the outputs."""
        W, _ = self.split(p)
        xs, zs = cache
        g = [0.0] * self.size
        dins = []
        k = self.n_out * self.n_in
        for x, z, dout in zip(xs, zs, douts):
            dz = (list(dout) if self.s == S - 1 else
                  [dout[o] * gelu_grad(z[o]) for o in range(self.n_out)])
            for o in range(self.n_out):
                for i in range(self.n_in):
                    g[o * self.n_in + i] += dz[o] * x[i]
                g[k + o] += dz[o]
            dins.append([sum(W[o * self.n_in + i] * dz[o]
                             for o in range(self.n_out))
                         for i in range(self.n_in)])
        return g, dins


def loss_grad(logits, labels):
    """d(mean cross-entropy)/d logits over the micro-batch."""
    mb = len(logits)
    out = []
    for z, y in zip(logits, labels):
        top = max(z)
        e = [math.exp(v - top) for v in z]
        tot = sum(e)
        out.append([(e[c] / tot - (1.0 if c == y else 0.0)) / mb
                    for c in range(len(z))])
    return out


def init_weights(rng):
    ws = []
    for s in range(S):
        bound = 1.0 / math.sqrt(SIZES[s])
        ws.append([rng.uniform(-bound, bound) for _ in range(Layer(s).size)])
    return ws


def make_data(rng, count):
    """Three classes, each a cluster around its own centre, so the loss
    falls and the gradients stay of one size."""
    centres = [[rng.gauss(0, 1) for _ in range(SIZES[0])] for _ in range(3)]
    xs, ys = [], []
    for _ in range(count):
        y = rng.randrange(3)
        xs.append([c + rng.gauss(0, 0.7) for c in centres[y]])
        ys.append(y)
    return xs, ys


def run(mitigation, mb, w0, xs, ys):
    """The trajectory: traj[s][n] = stage s's weights after its pair n."""
    layers = [Layer(s) for s in range(S)]
    D = [2 * (S - 1 - s) for s in range(S)]
    w = [list(p) for p in w0]
    v = [[0.0] * L.size for L in layers]
    delta = [[0.0] * L.size for L in layers]
    updates = [0] * S
    saved = [dict() for _ in range(S)]  # micro-batch -> (cache, weights)
    fwd_out = {}  # (stage, micro-batch) -> outputs
    bwd_out = {}  # (stage, micro-batch) -> input gradients
    traj = [[None] * N for _ in range(S)]
    lwp = mitigation in ("lwp", "sc+lwp")
    sc = mitigation in ("sc", "sc+lwp")
    for t in range(N + S - 1):
        # each stage reads only what the tick before wrote
        for s in range(S):
            n = t - s
            if not 0 <= n < N:
                continue
            L = layers[s]
            # the forward of micro-batch n
            if s == 0:
                inp = xs[n * mb:(n + 1) * mb]
            else:
                inp = fwd_out.pop((s - 1, n))
            wf = w[s]
            if lwp and D[s] > 0:
                wf = [w[s][i] - LR * D[s] * v[s][i] for i in range(L.size)]
            out, cache = L.forward(wf, inp)
            saved[s][n] = (cache, list(w[s]))
            if s < S - 1:
                fwd_out[(s, n)] = out
            else:
                fwd_out[(s, n)] = loss_grad(out, ys[n * mb:(n + 1) * mb])
            # the backward of micro-batch j = n - D and the update
            j = n - D[s]
            if j >= 0:
                dout = (fwd_out.pop((s, j)) if s == S - 1 else
                        bwd_out.pop((s + 1, j)))
                cache, w_seen = saved[s].pop(j)
                if mitigation == "stash":
                    wb = w_seen
                elif mitigation == "pipemare" and D[s] > 0:
                    wb = [w[s][i] - D[s] * delta[s][i] for i in range(L.size)]
                else:
                    wb = w[s]
                g, din = L.backward(wb, cache, dout)
                if s > 0:
                    bwd_out[(s, j)] = din
                lr = LR
                if mitigation == "pipemare" and D[s] >= 1:
                    done = min(updates[s] / WARMUP, 1.0)
                    lr = LR * D[s] ** (-(1.0 - done))
                old = list(w[s])
                if sc and D[s] > 0:
                    a = MOM ** D[s]
                    b = (1.0 - MOM ** D[s]) / (1.0 - MOM)
                else:
                    a, b = 1.0, 0.0
                for i in range(L.size):
                    v[s][i] = MOM * v[s][i] + g[i]
                    w[s][i] -= lr * (a * v[s][i] + b * g[i])
                if mitigation == "pipemare":
                    for i in range(L.size):
                        delta[s][i] = (GAMMA * delta[s][i] +
                                       (1.0 - GAMMA) * (w[s][i] - old[i]))
                updates[s] += 1
            traj[s][n] = list(w[s])
    for s in range(S):
        assert updates[s] == N - D[s], (s, updates[s])
    return traj


def perturbed(w0, rng):
    eps = 2.0 ** -23
    return [[x * (1.0 + eps * rng.choice((-1.0, 1.0))) for x in p]
            for p in w0]


def write_safetensors(path, tensors, meta):
    """tensors: name -> (dtype, shape, flat list)."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, flat) in tensors.items():
        blob = struct.pack("<%d%s" % (len(flat), "f" if dtype == "F32" else
                                      "i"), *flat)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    header["__metadata__"] = meta
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def tensor_entries(prefix, weights_per_stage, rows):
    """The per-stage flat lists as strata's tensors; rows: leading dim
    (None: a single state)."""
    out = {}
    for s in range(S):
        L = Layer(s)
        k = L.n_out * L.n_in
        lead = [] if rows is None else [rows]
        seq = [weights_per_stage[s]] if rows is None else weights_per_stage[s]
        out[f"{prefix}{NAMES[s]}.weight"] = (
            "F32", lead + [L.n_out, L.n_in], [x for p in seq for x in p[:k]])
        out[f"{prefix}{NAMES[s]}.bias"] = (
            "F32", lead + [L.n_out], [x for p in seq for x in p[k:]])
    return out


def main():
    rng = random.Random(20261127)
    w0 = init_weights(rng)
    xs, ys = make_data(rng, N * max(MICRO))
    tensors = {"x": ("F32", [len(xs), SIZES[0]], [v for x in xs for v in x]),
               "y": ("I32", [len(ys)], ys)}
    tensors.update(tensor_entries("init.", w0, None))
    meta = {"strata_fixture": "1", "stages": str(S), "pairs": str(N),
            "lr": repr(LR), "momentum": repr(MOM),
            "pipemare_warmup": str(WARMUP), "pipemare_gamma": repr(GAMMA),
            "hidden": json.dumps(SIZES[1:-1]), "classes": str(SIZES[-1]),
            "generator": "tests/ref/gen_pb.py"}
    for mit in MITIGATIONS:
        for mb in MICRO:
            case = f"{mit}.mb{mb}"
            traj = run(mit, mb, w0, xs, ys)
            other = run(mit, mb, perturbed(w0, random.Random(mb)), xs, ys)
            cond = max(abs(a - b) for s in range(S) for n in range(N)
                       for a, b in zip(traj[s][n], other[s][n]))
            moved = max(abs(a - b) for s in range(S)
                        for a, b in zip(traj[s][N - 1], w0[s]))
            meta[f"cond.{case}"] = "%.3e" % cond
            tensors.update(tensor_entries(case + ".", traj, N))
            print(f"{case:13s} moved {moved:.3f}, a float32 ulp of the "
                  f"initial weights moves it by {cond:.2e}", file=sys.stderr)
    write_safetensors(OUT, tensors, meta)
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
