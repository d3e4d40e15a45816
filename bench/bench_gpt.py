#!/usr/bin/python3
"""bench_gpt.py — the PyTorch peer of bench/bench_gpt.c.

A minimal GPT-2 written the way a PyTorch user would (nanoGPT's layout):
token + learned position embeddings, pre-LN blocks (ln_1, causal
self-attention with c_attn / c_proj, residual; ln_2, c_fc, gelu tanh,
c_proj, residual), ln_f and an output head tied to the token embedding,
F.cross_entropy over every position, torch.optim.AdamW (lr 3e-4, betas 0.9 /
0.95, weight decay 0.1, as bench_gpt.c configures strata), float32, no
dropout. Weights are drawn as GPT-2's (normal, std 0.02; the two residual
projections 0.02 / sqrt(2 layers)); biases zero.

Attention: torch 1.13 has no public F.scaled_dot_product_attention (2.0
added it). The private F._scaled_dot_product_attention(is_causal=True) is
the same math in C++; the explicit form (q k^T, masked_fill with -inf,
softmax, @ v) is what nanoGPT falls back to. The default "best" times a
forward + backward of each on this shape before the run (alternating, best
of 3 after a warm-up) and keeps the faster, so the peer is never handicapped
by the choice (named in the output).

The data: random token ids below 256 (strata reads bytes of a random file),
held as tensors, so the loop measures only zero_grad(set_to_none=True) +
forward + loss + backward + step.

Threads, as bench_mlp.py explains: torch.set_num_threads does not reach the
system OpenBLAS's pool, so T threads means OPENBLAS_NUM_THREADS (and
OMP_NUM_THREADS) = T set before torch loads. With T > 1 both splits are
timed (intra-op T, or intra-op 1 with the T threads left to the BLAS) and the
better reported.

Prints one line:
  torch gpt model=M ... batch=B threads=T steps_per_s=X tokens_per_s=Y (...)
Usage: /usr/bin/python3 bench/bench_gpt.py MODEL BATCH THREADS [SECONDS]
       [--attention=best|explicit|sdpa]
  MODEL: 124m (12 layers, width 768, 12 heads, context 256, vocab 50257),
         tiny (configs/gpt_tiny.yaml: 4, 128, 4, 64, 256) or L,C,NH,T,V.
"""
import math
import os
import sys
import time

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
if len(ARGS) >= 3:
    for var in ("OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = ARGS[2]

import torch  # noqa: E402  (after the thread variables on purpose)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SHAPES = {"124m": (12, 768, 12, 256, 50257), "tiny": (4, 128, 4, 64, 256)}


def parse_model(text):
    if text in SHAPES:
        return SHAPES[text]
    parts = [int(p) for p in text.split(",")]
    if len(parts) != 5 or min(parts) < 1 or parts[1] % parts[2]:
        raise ValueError(text)
    return tuple(parts)


def attention_explicit(q, k, v, mask):
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf"))
    return F.softmax(att, dim=-1) @ v


def attention_sdpa(q, k, v, mask):
    return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]


ATTENTION = {"explicit": attention_explicit, "sdpa": attention_sdpa}


class Block(nn.Module):
    def __init__(self, C, NH, T):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.register_buffer("mask",
                             torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        self.attention = attention_explicit

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2)
                   for t in (q, k, v))
        y = self.attention(q, k, v, self.mask)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp_proj(h)


class GPT(nn.Module):
    def __init__(self, L, C, NH, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH, T) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * L))
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)),
                               targets.view(-1))


def pick_attention(choice, B, NH, T, hs):
    """The faster of the two forms on this shape (forward + backward)."""
    if choice != "best":
        return choice
    q, k, v = (torch.randn(B, NH, T, hs, requires_grad=True) for _ in range(3))
    mask = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    took = {name: float("inf") for name in ATTENTION}
    for rnd in range(4):  # alternating; the first round only warms up
        for name, fn in ATTENTION.items():
            t0 = time.perf_counter()
            fn(q, k, v, mask).sum().backward()
            if rnd > 0:
                took[name] = min(took[name], time.perf_counter() - t0)
    return min(took, key=took.get)


def main():
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    choice = "best"
    for f in flags:
        name, _, value = f.partition("=")
        if name != "--attention" or value not in ("best", *ATTENTION):
            sys.exit("bench_gpt.py: unknown flag %s" % f)
        choice = value
    if len(ARGS) not in (3, 4):
        sys.exit("usage: bench_gpt.py MODEL BATCH THREADS [SECONDS] "
                 "[--attention=best|explicit|sdpa]")
    L, C, NH, T, V = parse_model(ARGS[0])
    batch, threads = int(ARGS[1]), int(ARGS[2])
    seconds = float(ARGS[3]) if len(ARGS) == 4 else 1.5
    torch.manual_seed(42)
    torch.set_num_threads(threads)
    attention = pick_attention(choice, batch, NH, T, C // NH)

    model = GPT(L, C, NH, T, V)
    for block in model.h:
        block.attention = ATTENTION[attention]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=0.1)
    tokens = torch.randint(0, 256, (64 * batch, T + 1))
    batches = [(tokens[i:i + batch, :T].contiguous(),
                tokens[i:i + batch, 1:].contiguous())
               for i in range(0, 64 * batch, batch)]
    step_count = [0]

    def run_steps(k):
        for _ in range(k):
            xb, yb = batches[step_count[0] % len(batches)]
            step_count[0] += 1
            opt.zero_grad(set_to_none=True)
            model(xb, yb).backward()
            opt.step()

    def timed():
        # Warm-up as bench_gpt.c: steps until 0.25 s have passed, at least
        # one (AdamW allocates its state in the first); then the timed
        # span, at least 2 steps.
        t0 = time.perf_counter()
        run_steps(1)
        while time.perf_counter() - t0 < 0.25:
            run_steps(1)
        steps, t0 = 0, time.perf_counter()
        while steps < 2 or time.perf_counter() - t0 < seconds:
            run_steps(1)
            steps += 1
        return steps / (time.perf_counter() - t0)

    best, best_split = 0.0, ""
    for intra_op in sorted({threads, 1}, reverse=True):
        torch.set_num_threads(intra_op)
        rate = timed()
        if rate > best:
            best, best_split = rate, "intra_op=%d blas=%d" % (intra_op, threads)
    print("torch gpt model=%s layers=%d width=%d heads=%d context=%d vocab=%d "
          "batch=%d threads=%d steps_per_s=%.4f tokens_per_s=%.1f "
          "(%s attention=%s)"
          % (ARGS[0], L, C, NH, T, V, batch, threads, best, best * batch * T,
             best_split, attention))


if __name__ == "__main__":
    main()
