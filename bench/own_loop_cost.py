"""A user's own bf16 loop, as they wrote it (a small transformer classifier in bf16, AdamW at
lr 1e-4), against the same loop after the doctor's line
`opt = mixtrain.optim.from_torch(opt, weight_update="stochastic")`: whole steps (forward,
backward, optimizer), interleaved rounds, medians compared. The issue's goal: at most 1.10x.

    PYTHONPATH=build/python .venv/bin/python bench/own_loop_cost.py [STEPS] [ROUNDS]
"""
import copy
import statistics
import sys
import time

import torch
import torch.nn as nn

import mixtrain
from bench_models import Encoder  # the small transformer classifier

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
torch.manual_seed(0)


x = torch.randint(0, 64, (steps, 32, 64))
y = torch.randint(0, 8, (steps, 32))
base = Encoder().to(torch.bfloat16)
theirs_model, ours_model = copy.deepcopy(base), copy.deepcopy(base)
theirs = torch.optim.AdamW(theirs_model.parameters(), lr=1e-4)
ours = mixtrain.optim.from_torch(torch.optim.AdamW(ours_model.parameters(), lr=1e-4), weight_update="stochastic")


def run(model, opt):
    t0 = time.perf_counter()
    for i in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[i]).float(), y[i]).backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


run(theirs_model, theirs)  # warm-up
run(ours_model, ours)
times = {"torch AdamW": [], "from_torch stochastic": []}
for _ in range(rounds):
    times["torch AdamW"].append(run(theirs_model, theirs))
    times["from_torch stochastic"].append(run(ours_model, ours))
params = sum(p.numel() for p in base.parameters())
base_t = statistics.median(times["torch AdamW"])
print("own bf16 loop, %d parameters, bs 32 x 64 tokens, %d threads, torch %s" % (params, torch.get_num_threads(),
                                                                              torch.__version__))
for name, ts in times.items():
    med = statistics.median(ts)
    print("  %-24s %8.1f ms a step  %.2fx" % (name, med * 1e3, med / base_t))
