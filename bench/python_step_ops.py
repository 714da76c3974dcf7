"""What one training step of a plain PyTorch-Python loop dispatches, the peer of
bench/step_ops.cpp: top-level ATen ops counted by a TorchDispatchMode (below
autograd; an op's inner calls are not counted again), and CPU allocations counted by
torch's profiler (profile_memory=True: the allocator's reports, the hook step_ops
counts in C++). The loops are bench/python_loop.py's CNN step and
bench/python_transformer.py's, with torch's default optimizer settings.

    .venv/bin/python bench/python_step_ops.py cnn|transformer BATCH [fp32|fp16|bf16|bf16-pure] [--steps N] [--names]
prints one JSON line: a step's time split into phases (the mean of STEPS steps after 3 warm-up
ones, at torch's default threads), then the ops and allocations of one more step.
"""
import collections
import contextlib
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._C._profiler import _EventType
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from python_transformer import built_in_transformer  # noqa: E402


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names[func.overloadpacket._qualified_op_name] += 1
        return func(*args, **(kwargs or {}))


def allocations(nodes):
    """The sizes of the allocations in a profile's event tree."""
    sizes = []
    for e in nodes:
        if e.typed[0] == _EventType.Allocation and e.typed[1].alloc_size > 0:
            sizes.append(e.typed[1].alloc_size)
        sizes += allocations(e.children)
    return sizes


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


def main():
    name, batch = sys.argv[1], int(sys.argv[2])
    precision = sys.argv[3] if len(sys.argv) > 3 and not sys.argv[3].startswith("--") else "fp32"
    # glibc maps every large block anew until the process frees one; the Learner sets its
    # thresholds (settle_malloc_for_training), and a loop that loaded its data has slid
    # them there: free one large block first, as such a loop has.
    torch.empty(30 << 20, dtype=torch.uint8).fill_(0)  # allocated, touched and freed
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 20
    n = (4 + steps) * batch
    torch.manual_seed(0)
    if name == "cnn":
        model = cnn()
        x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
        betas = (0.95, 0.99)
    else:
        model = built_in_transformer()
        x, y = torch.randint(0, 256, (n, 64)), torch.randint(0, 256, (n, 64))
        betas = (0.9, 0.99)
    if precision == "bf16-pure":
        model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=betas, eps=1e-5, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    region = (lambda: torch.autocast("cpu", dtype=amp_dtype)) if amp_dtype else contextlib.nullcontext
    order = torch.randperm(x.shape[0])

    phases = dict.fromkeys(("data", "forward", "loss", "backward", "optimizer", "callbacks"), 0.0)

    def step(i, clock=None):
        mark = clock or (lambda phase: None)
        idx = order[i * batch:(i + 1) * batch]
        xb, yb = x[idx], y[idx]
        if precision == "bf16-pure" and xb.is_floating_point():
            xb = xb.to(torch.bfloat16)
        mark("data")
        with region():
            out = model(xb)
        mark("forward")
        loss = F.cross_entropy(out.float().reshape(-1, out.shape[-1]), yb.reshape(-1))
        mark("loss")
        if scaler:
            scaler.scale(loss).backward()
            mark("backward")
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            mark("backward")
            opt.step()
        opt.zero_grad()
        mark("optimizer")
        value = loss.item()  # what a loop logs
        mark("callbacks")
        return value

    model.train()
    warmup = 3
    for i in range(warmup):
        step(i)
    last = [time.perf_counter()]

    def clock(phase):
        now = time.perf_counter()
        phases[phase] += 1000 * (now - last[0])
        last[0] = now

    for i in range(warmup, warmup + steps):
        step(i, clock)
    ops = CountOps()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        with ops:
            step(warmup + steps)
    sizes = allocations(prof.profiler.kineto_results.experimental_event_tree())
    # The counting mode's own profiler scopes are not the step's.
    names = {k: v for k, v in ops.names.items() if not k.startswith("profiler::")}
    out = {"model": name, "precision": precision, "loop": "python", "ops": sum(names.values()),
           "allocations": len(sizes), "allocated_mb": round(sum(sizes) / 1e6, 1),
           "step_ms": round(sum(phases.values()) / steps, 3),
           "phases_ms": {k: round(v / steps, 6) for k, v in phases.items()}}
    if "--names" in sys.argv:
        out["names"] = dict(sorted(names.items()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
