#!/usr/bin/python3
"""bench_mlp.py — the PyTorch peer of bench/bench_mlp.c.

The same model and step as strata's MLP bench: 784-256-256-10 (Linear, ReLU),
CrossEntropyLoss (mean), SGD lr 0.01 momentum 0.9, torch.set_num_threads(T).
The data is random and already in memory as tensors (8192 samples, cycled by
batch), so the loop measures only zero_grad(set_to_none=True) + forward +
backward + step — strata's step also assembles its batch from bytes, which
only makes the comparison harder for strata.

Threads: Debian's torch does its matrix products in the system BLAS
(libblas.so.3, OpenBLAS here), and torch.set_num_threads does not reach
OpenBLAS's own thread pool: a "1-thread" torch ran its GEMMs on 2 threads
(measured: 256x784 @ 784x256 at 127 GFLOP/s with set_num_threads(1), 96 with
OPENBLAS_NUM_THREADS=1 as well). So T cores means T BLAS threads too, set
before torch loads. With T > 1 torch has two ways to use the cores — intra-op
threads T, or intra-op 1 with the T threads left to the BLAS — and on a
loaded 2-vCPU machine the first collapses; both are timed and the better one
is reported (named in the output), so the peer is never handicapped.

Prints one line: torch mlp batch=B threads=T samples_per_s=X
Usage: /usr/bin/python3 bench/bench_mlp.py BATCH THREADS [SECONDS]
"""
import os
import sys
import time

if len(sys.argv) >= 3:
    for var in ("OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = sys.argv[2]

import torch  # noqa: E402  (after the thread variables on purpose)


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: bench_mlp.py BATCH THREADS [SECONDS]")
    batch, threads = int(sys.argv[1]), int(sys.argv[2])
    seconds = float(sys.argv[3]) if len(sys.argv) == 4 else 1.5
    torch.manual_seed(42)

    n = 8192
    x = torch.rand(n, 784)
    y = torch.randint(0, 10, (n,))
    batches = [(x[i:i + batch], y[i:i + batch])
               for i in range(0, n - batch + 1, batch)]

    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    step_count = [0]

    def run_steps(k):
        for _ in range(k):
            xb, yb = batches[step_count[0] % len(batches)]
            step_count[0] += 1
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()

    def timed():
        # Warm-up, which also measures the step time so that the timed run
        # lasts about `seconds` (as bench_mlp.c does).
        run_steps(5)
        warm, t0, elapsed = 0, time.perf_counter(), 0.0
        while elapsed < 0.25:
            run_steps(5)
            warm += 5
            elapsed = time.perf_counter() - t0
        steps = max(10, int(seconds * warm / elapsed) + 1)
        t0 = time.perf_counter()
        run_steps(steps)
        return steps * batch / (time.perf_counter() - t0)

    best, best_split = 0.0, ""
    for intra_op in sorted({threads, 1}, reverse=True):
        torch.set_num_threads(intra_op)
        rate = timed()
        if rate > best:
            best, best_split = rate, "intra_op=%d blas=%d" % (intra_op, threads)
    print("torch mlp batch=%d threads=%d samples_per_s=%.1f (%s)"
          % (batch, threads, best, best_split))


if __name__ == "__main__":
    main()
