"""The optimizer pass alone: one AdamW step over N parameters (10M by default), measured in
one run, interleaved rounds, medians compared:

- bf16 storage: mixtrain.optim.AdamW (the C++ core: fp32 arithmetic, written back once, lost
  updates counted; "nearest" and "stochastic") against torch.optim.AdamW(foreach=True) on the
  same bf16 tensors (torch's own rounding at every op), the issue's goal: at most 1.0x;
- fp32 storage: mixtrain.optim.AdamW against torch.optim.AdamW(fused=True) (the CPU has it in
  torch 2.13) and foreach=True.

Each on 1 thread and on all the machine's threads (on a busy 2-core box 2 threads can be
slower than 1: compare within a thread count).

    PYTHONPATH=build/python .venv/bin/python bench/optimizer_pass.py [N] [ROUNDS] [TENSORS]

TENSORS (10 by default): how many equal tensors hold the N parameters (a model's layers).
"""
import statistics
import sys
import time

import torch

import mixtrain  # noqa: F401 (loads the native core)
from mixtrain import optim

n = int(float(sys.argv[1])) if len(sys.argv) > 1 else 10_000_000
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
# Ten tensors by default, as a model's layers are (one multi-tensor call in foreach/fused).
tensors = int(sys.argv[3]) if len(sys.argv) > 3 else 10
shapes = [n // tensors] * tensors


def make(dtype, factory):
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).mul_(1e-3).to(dtype)
    opt = factory(params)
    opt.step()  # state made, first step out of the timing
    return opt


def timed(opt):
    t0 = time.perf_counter()
    opt.step()
    return time.perf_counter() - t0


cases = {
    "bf16": {
        "torch AdamW foreach": lambda: make(torch.bfloat16, lambda p: torch.optim.AdamW(p, lr=1e-4, foreach=True)),
        "mixtrain AdamW nearest": lambda: make(torch.bfloat16, lambda p: optim.AdamW(p, lr=1e-4)),
        "mixtrain AdamW stochastic": lambda: make(torch.bfloat16,
                                                  lambda p: optim.AdamW(p, lr=1e-4, weight_update="stochastic")),
    },
    "fp32": {
        "torch AdamW fused": lambda: make(torch.float32, lambda p: torch.optim.AdamW(p, lr=1e-4, fused=True)),
        "torch AdamW foreach": lambda: make(torch.float32, lambda p: torch.optim.AdamW(p, lr=1e-4, foreach=True)),
        "mixtrain AdamW": lambda: make(torch.float32, lambda p: optim.AdamW(p, lr=1e-4)),
    },
}

all_threads = torch.get_num_threads()
print("optimizer pass, AdamW, %d parameters in %d tensors, %d rounds, torch %s" % (n, tensors, rounds, torch.__version__))
for threads in sorted({1, all_threads}):
    torch.set_num_threads(threads)
    for storage, made in cases.items():
        opts = {name: make_opt() for name, make_opt in made.items()}
        times = {name: [] for name in opts}
        for _ in range(rounds):
            for name, opt in opts.items():
                times[name].append(timed(opt))
        base_name = next(iter(opts))
        base = statistics.median(times[base_name])
        for name in opts:
            med = statistics.median(times[name])
            print("  %d thread(s)  %-5s %-28s %8.1f ms  %.2fx %s" % (threads, storage, name, med * 1e3, med / base,
                                                                     "(baseline)" if name == base_name else ""))
        del opts
