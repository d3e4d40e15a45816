#!/usr/bin/python3
"""gen_gpt.py — the PyTorch reference for strata's GPT model (model.kind
gpt), read by tests/model/test_gpt.c.

Run from the repository root with Debian's torch:

    /usr/bin/python3 tests/ref/gen_gpt.py

It writes two files:
  tests/fixtures/gpt_corpus.txt        the training text (generated here)
  tests/fixtures/gpt_tiny.safetensors  what PyTorch computes on it

The model is a minimal GPT-2 written here from torch's functional ops (no
Hugging Face code): token + learned position embedding, pre-layernorm blocks
  y = x + c_proj(attention(c_attn(ln_1(x))))
  y + mlp.c_proj(gelu_tanh(c_fc(ln_2(y))))
with (in, out)-stored Conv1D weights, a causal softmax scaled by
1/sqrt(head size), layernorm eps 1e-5, then ln_f and a head sharing the
token embedding. Tensor names are Hugging Face GPT-2's, as in strata.

Shapes are configs/gpt_tiny.yaml's: context 64, 4 layers, 4 heads, width
128, MLP ratio 4, byte vocabulary 256, no dropout. Two variants:
  learned  tied head, learned positions (gpt_tiny itself);
  rotary   untied head (its own lm_head.weight), no wpe, GPT-NeoX rotary
           positions (base 10000, halves x[:rd/2] / x[rd/2:rd]) on the first
           rotary_dim = 16 of each head's 32 dims, so the pass-through dims
           are exercised too.

Initial weights are not stored: both sides compute them from a formula.
Element i of tensor NAME is
    h = splitmix64(fnv1a64(NAME) + i)   (64-bit wrap-around arithmetic)
    s = 2 * (h >> 11) * 2^-53 - 1       (exact in double, in [-1, 1))
    w = float32(a * s)                  (one rounding)
with a = 0.035 (std 0.02: wte, c_attn, c_fc, lm_head weights), 0.0125
(c_proj weights, GPT-2's 0.02 / sqrt(2 layers)), 0.0175 (wpe), 0.01 (linear
biases), 0.05 (layernorm biases) and layernorm weights 1 + 0.1 s. Integer
operations, one double multiply (and one add) and one rounding are the same
in numpy and C, so the weights agree bit for bit; the fixture stores, per
tensor, the double sum of its weights and its first and last element
(`init.NAME`), and the C test checks them before anything else.

The data: tests/fixtures/gpt_corpus.txt, 6000 bytes of sentences drawn by a
fixed 64-bit LCG from small word lists (so the file is reproducible and
`make test` needs no torch and no Debian fortunes). As strata's trainer
does with data.val_fraction 0.1, the first 5400 tokens (bytes) train;
training sample j is the window tokens[64 j .. 64 j + 64], inputs its first
64 tokens and labels the next token of each; batches of 4 take the windows in
order (data.shuffle false) and an epoch ends when the next batch would not
be whole (84 windows: 21 steps per epoch).

Stored per variant V (every float a float64 result rounded to float32):
  V.dims             I32: B, T, layers, heads, width, vocab, rotary_dim,
                     tied, steps, GRAD_STRIDE, FULL_BELOW
  V.logits           (R, T, 256) logits of the first R sequences of batch 0
                     (R = 2 for learned, 1 for rotary)
  V.loss             (1) mean cross-entropy over batch 0's 4 x 64 positions
  V.grad.NAME        the gradient of that loss for parameter NAME: every
                     element when the tensor has at most FULL_BELOW elements
                     (biases, layernorms), else elements 0, 61, 122, ...
                     (GRAD_STRIDE 61 is prime, so with rows of 128 to 512
                     columns and at least 64 rows every row holds two or more
                     samples and every column at least one); the tied
                     transformer.wte.weight gets the sum of both uses
  V.gstat.NAME       (2) max |g| and the L2 norm of the whole gradient
  V.init.NAME        (3) see above
  V.losses           (50) batch loss of each of 50 AdamW steps, lr 1e-3
                     constant, betas (0.9, 0.95), eps 1e-8, weight decay 0.1
                     on every parameter (strata decays all of them, so the
                     reference does too)
Size: every gradient element of gpt_tiny would be 3.3 MB per variant; the
samples (1/61 of each matrix, all of the small tensors) with the
whole-tensor max and norm are about 75 KB, and the file about 400 KB, most
of it the logits.

Conditioning. Everything is computed twice, in float32 and in float64 from
the same float32 weights. The float64 results are stored, so what the C test
reports is strata's own fp32 rounding; the float32 run must agree with them
within 1e-5 (max |diff| / max |ref| for logits and each gradient, relative
per step for the losses), 10x inside the test's 1e-4. And the trajectory
must not amplify rounding: a float64 run from weights nudged by up to half
an fp32 ulp must stay within 2.5e-5 of the stored losses. When written:
fp32 vs fp64 logits 4e-7 / 6e-7 (learned / rotary), gradients 6e-7 / 8e-7,
losses 1.0e-6 / 4.9e-6; nudged 2.2e-6 (at step 29) / 1.8e-6 (step 4). Those
two steps are where the trajectory is most sensitive (other nudges moved
them by up to 1.6e-5) and where strata's own largest differences were.
"""
import math
import os
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_ops  # noqa: E402  (the fixture writer and its version)

CORPUS = os.path.join("tests", "fixtures", "gpt_corpus.txt")
FIXTURE = os.path.join("tests", "fixtures", "gpt_tiny.safetensors")
CORPUS_BYTES = 6000
VAL_FRACTION = 0.1  # strata stores it as float32; see train_tokens()
T, LAYERS, HEADS, WIDTH, RATIO, VOCAB = 64, 4, 4, 128, 4, 256
BATCH, STEPS = 4, 50
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.95), 1e-8, 0.1
GRAD_STRIDE, FULL_BELOW = 61, 1024
DRIFT_MAX = 1e-5     # float32 vs float64, each result
PERTURB_MAX = 2.5e-5  # losses after a rounding-sized change of the weights
VARIANTS = (("learned", {"rotary_dim": 0, "tied": True, "logit_rows": 2}),
            ("rotary", {"rotary_dim": 16, "tied": False, "logit_rows": 1}))
MASK64 = (1 << 64) - 1


# ------------------------------------------------------------------ corpus

def lcg(state):
    """Knuth's MMIX LCG; returns (new state, 31 high bits)."""
    state = (state * 6364136223846793005 + 1442695040888963407) & MASK64
    return state, state >> 33


def make_corpus():
    subjects = ["the cat", "a dog", "the old man", "my sister", "the river",
                "a small bird", "the teacher", "our neighbour", "the wind",
                "a tired horse", "the baker", "the moon"]
    verbs = ["sees", "follows", "paints", "hears", "carries", "finds",
             "watches", "remembers", "builds", "forgets", "answers", "keeps"]
    objects = ["the red door", "a quiet song", "the long road", "a warm loaf",
               "the garden wall", "an empty boat", "the last letter",
               "a paper kite", "the stone bridge", "a green apple"]
    endings = [".", ".", ".", "!", "?", ", and then it rains.",
               " every morning.", " at night."]
    state, out = 2024, []
    size = 0
    while size < CORPUS_BYTES:
        words = []
        for choices in (subjects, verbs, objects, endings):
            state, r = lcg(state)
            words.append(choices[r % len(choices)])
        sentence = " ".join(words[:3]) + words[3]
        sentence = sentence[0].upper() + sentence[1:]
        state, r = lcg(state)
        sentence += "\n" if r % 5 == 0 else " "
        out.append(sentence)
        size += len(sentence)
    return "".join(out).encode("ascii")[:CORPUS_BYTES]


def train_tokens(corpus):
    """strata's split (src/data/text.c): floor(n * val_fraction) held out,
    val_fraction being the float32 config value widened to double."""
    n = len(corpus)
    n_val = int(math.floor(n * float(np.float32(VAL_FRACTION))))
    return np.frombuffer(corpus, dtype=np.uint8)[:n - n_val].astype(np.int64)


def batches(tokens):
    """(inputs, labels) of each step, windows in order as strata's trainer
    takes them (a new epoch when a whole batch no longer fits)."""
    windows = (len(tokens) - 1) // T
    pos, out = 0, []
    for _ in range(STEPS):
        if pos + BATCH > windows:
            pos = 0
        idx = np.stack([tokens[(pos + b) * T:(pos + b) * T + T + 1]
                        for b in range(BATCH)])
        out.append((torch.from_numpy(idx[:, :T].copy()),
                    torch.from_numpy(idx[:, 1:].copy())))
        pos += BATCH
    return out


# ----------------------------------------------------------------- weights

def fnv1a64(text):
    h = 0xcbf29ce484222325
    for byte in text.encode("ascii"):
        h = ((h ^ byte) * 0x100000001b3) & MASK64
    return h


def splitmix64(x):
    """On a numpy uint64 array (wraps modulo 2^64)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def formula_weights(name, shape):
    n = int(np.prod(shape))
    index = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = splitmix64(np.uint64(fnv1a64(name)) + index)
    s = 2.0 * ((h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53) - 1.0
    if ".ln_" in name:
        w = 1.0 + 0.1 * s if name.endswith(".weight") else 0.05 * s
    elif name.endswith(".bias"):
        w = 0.01 * s
    elif "wpe" in name:
        w = 0.0175 * s
    elif "c_proj" in name:
        w = 0.0125 * s
    else:
        w = 0.035 * s
    return w.astype(np.float32).reshape(shape)


def parameter_shapes(rotary_dim, tied):
    C = WIDTH
    shapes = [("transformer.wte.weight", (VOCAB, C))]
    if not rotary_dim:
        shapes.append(("transformer.wpe.weight", (T, C)))
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        shapes += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                   (p + "attn.c_attn.weight", (C, 3 * C)),
                   (p + "attn.c_attn.bias", (3 * C,)),
                   (p + "attn.c_proj.weight", (C, C)),
                   (p + "attn.c_proj.bias", (C,)),
                   (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                   (p + "mlp.c_fc.weight", (C, RATIO * C)),
                   (p + "mlp.c_fc.bias", (RATIO * C,)),
                   (p + "mlp.c_proj.weight", (RATIO * C, C)),
                   (p + "mlp.c_proj.bias", (C,))]
    shapes += [("transformer.ln_f.weight", (C,)),
               ("transformer.ln_f.bias", (C,))]
    if not tied:
        shapes.append(("lm_head.weight", (VOCAB, C)))
    return shapes


# ------------------------------------------------------------------- model

def rotary(x, rotary_dim):
    """x (B, NH, T, hs): turn pair (x[i], x[i + rd/2]), i < rd/2, at position
    t by t * 10000^(-2i/rd); dims from rd on pass through. Angles in
    float64, as strata takes them."""
    half = rotary_dim // 2
    freq = 10000.0 ** (-2.0 * np.arange(half) / rotary_dim)
    angle = np.arange(x.shape[2])[:, None] * freq[None, :]  # (T, half)
    cos = torch.from_numpy(np.cos(angle)).to(x.dtype)
    sin = torch.from_numpy(np.sin(angle)).to(x.dtype)
    a, b = x[..., :half], x[..., half:rotary_dim]
    return torch.cat((a * cos - b * sin, b * cos + a * sin,
                      x[..., rotary_dim:]), dim=-1)


def forward(p, idx, rotary_dim):
    """p: name -> tensor; idx (B, T) token ids; returns logits (B, T, V)."""
    B, Tn = idx.shape
    C, hs = WIDTH, WIDTH // HEADS
    x = p["transformer.wte.weight"][idx]
    if not rotary_dim:
        x = x + p["transformer.wpe.weight"][:Tn]
    future = torch.ones(Tn, Tn, dtype=torch.bool).triu(1)
    for i in range(LAYERS):
        pre = f"transformer.h.{i}."
        h = F.layer_norm(x, (C,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"],
                         1e-5)
        qkv = h @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
        q, k, v = (part.reshape(B, Tn, HEADS, hs).transpose(1, 2)
                   for part in qkv.split(C, dim=-1))
        if rotary_dim:
            q, k = rotary(q, rotary_dim), rotary(k, rotary_dim)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, Tn, C)
        x = x + y @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"],
                         1e-5)
        h = F.gelu(h @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"],
                   approximate="tanh")
        x = x + h @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"],
                     p["transformer.ln_f.bias"], 1e-5)
    head = p.get("lm_head.weight", p["transformer.wte.weight"])
    return x @ head.t()


def loss_of(logits, labels):
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def run(init, steps, rotary_dim, logit_rows, dtype):
    """Logits, loss and gradients on batch 0, then the loss of each AdamW
    step (the first step's batch is batch 0 again)."""
    p = {k: torch.tensor(w, dtype=dtype, requires_grad=True)  # a copy
         for k, w in init.items()}
    x0, y0 = steps[0]
    logits = forward(p, x0, rotary_dim)
    loss = loss_of(logits, y0)
    loss.backward()
    grads = {k: t.grad.detach().clone() for k, t in p.items()}
    first = (logits[:logit_rows].detach().clone(), loss.item())
    for t in p.values():
        t.grad = None
    opt = torch.optim.AdamW(list(p.values()), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WEIGHT_DECAY)
    losses = []
    for x, y in steps:
        opt.zero_grad()
        loss = loss_of(forward(p, x, rotary_dim), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return first[0], first[1], grads, np.array(losses)


def max_rel(a, ref):
    """max |a - ref| / max |ref| (the measure the C test uses)."""
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


def sampled(g):
    flat = g.reshape(-1)
    return flat if flat.size <= FULL_BELOW else flat[::GRAD_STRIDE]


def variant(name, rotary_dim, tied, logit_rows, steps, out):
    shapes = parameter_shapes(rotary_dim, tied)
    init = {k: formula_weights(k, s) for k, s in shapes}
    logits32, loss32, grads32, losses32 = run(init, steps, rotary_dim,
                                              logit_rows, torch.float32)
    logits, loss, grads, losses = run(init, steps, rotary_dim, logit_rows,
                                       torch.float64)
    drift = {"logits": max_rel(logits32, logits),
             "loss": abs(loss32 - loss) / loss,
             "grads": max(max_rel(grads32[k], grads[k]) for k in grads),
             "losses": float(np.max(np.abs(losses32 - losses) / losses))}
    print(f"{name}: loss {loss:.6f}, step losses {losses[0]:.5f} .. "
          f"{losses[-1]:.5f}; fp32 vs fp64: " +
          ", ".join(f"{k} {v:.2g}" for k, v in drift.items()))
    for k, v in drift.items():
        assert v < DRIFT_MAX, f"{name}: {k} ill-conditioned ({v:.2g})"
    # The trajectory's own sensitivity: every initial weight moved by up to
    # half an fp32 ulp (relative 2^-24), then trained in float64.
    rng = np.random.default_rng(zlib.crc32(name.encode("ascii")))
    nudged = {k: w * (1.0 + rng.uniform(-2.0 ** -24, 2.0 ** -24, w.shape))
              for k, w in init.items()}
    losses_nudged = run(nudged, steps, rotary_dim, logit_rows,
                        torch.float64)[3]
    rel = np.abs(losses_nudged - losses) / losses
    print(f"{name}: weights nudged by 2^-24: losses move up to {rel.max():.2g}"
          f" (step {rel.argmax()})")
    assert rel.max() < PERTURB_MAX, f"{name}: trajectory too sensitive"

    def f32(key, array):
        out.append((f"{name}.{key}", np.asarray(array, np.float64)
                    .astype(np.float32)))

    out.append((f"{name}.dims", np.array(
        [BATCH, T, LAYERS, HEADS, WIDTH, VOCAB, rotary_dim, int(tied), STEPS,
         GRAD_STRIDE, FULL_BELOW], np.int32)))
    f32("logits", logits.numpy())
    f32("loss", [loss])
    f32("losses", losses)
    for k, _ in shapes:
        g = grads[k].numpy()
        w = init[k].reshape(-1)
        f32(f"init.{k}", [np.sum(w.astype(np.float64)), w[0], w[-1]])
        f32(f"grad.{k}", sampled(g))
        f32(f"gstat.{k}", [np.max(np.abs(g)), np.sqrt(np.sum(g * g))])


def main():
    torch.set_num_threads(1)
    corpus = make_corpus()
    with open(CORPUS, "wb") as f:
        f.write(corpus)
    steps = batches(train_tokens(corpus))
    out = []
    for name, opts in VARIANTS:
        variant(name, opts["rotary_dim"], opts["tied"], opts["logit_rows"],
                steps, out)
    size = gen_ops.write_safetensors(FIXTURE, out, "tests/ref/gen_gpt.py")
    print(f"{CORPUS}: {len(corpus)} bytes; {FIXTURE}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
