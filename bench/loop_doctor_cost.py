"""The field's case from issue #55: a small TransformerEncoder classifier pretrained in fp32,
then fine-tuned the Hugging Face way (model.to(torch.bfloat16), torch.optim.AdamW at a small
lr) in the user's own loop, and `mixtrain.doctor(model, data, optimizer=opt, steps=N)` called
from that loop. The doctor's time against one fp32 `mixtrain.train` of the same steps (the
issue's measure) and against the user's own fp32 and bf16 loops over the same batches; then
where the doctor's time went: the Python side (scripting, the loop's state, the window) and the
native side's phases (Diagnosis "timing": setup, the pair, after, the trials).

    PYTHONPATH=build/python .venv/bin/python bench/loop_doctor_cost.py [STEPS] [ROUNDS] [LR]
"""
import contextlib
import copy
import io
import statistics
import sys
import time

import torch
import torch.nn as nn

import mixtrain
from bench_models import Encoder  # the small transformer classifier

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 64
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
lr = float(sys.argv[3]) if len(sys.argv) > 3 else 5e-5
bs = 32
torch.manual_seed(0)
torch.set_num_threads(2)


def task(n, shift, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 64, (n, 64), generator=g)
    y = ((x[:, :32] + shift) % 64).float().mean(1).div(8).long().clamp(0, 7)
    return x, y


# Pretrained in fp32 on one rule, fine-tuned on a shifted one.
base = Encoder(d=128, layers=2)
px, py = task(4096, 0, 1)
opt = torch.optim.AdamW(base.parameters(), lr=1e-3)
for i in range(0, len(py), 64):
    opt.zero_grad()
    nn.functional.cross_entropy(base(px[i:i + 64]), py[i:i + 64]).backward()
    opt.step()
fx, fy = task(steps * bs, 3, 2)
vx, vy = task(512, 3, 3)
batches = [(fx[i * bs:(i + 1) * bs], fy[i * bs:(i + 1) * bs]) for i in range(steps)]


def own_loop(dtype):
    model = copy.deepcopy(base).to(dtype)
    o = torch.optim.AdamW(model.parameters(), lr=lr)
    start = time.perf_counter()
    for x, y in batches:
        o.zero_grad()
        nn.functional.cross_entropy(model(x).float(), y).backward()
        o.step()
    return time.perf_counter() - start


python_parts = {}


def timed(name, function):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            python_parts[name] = python_parts.get(name, 0.0) + time.perf_counter() - start
    return wrapper


mixtrain._scripted = timed("scripting", mixtrain._scripted)
mixtrain._loop_state = timed("loop state", mixtrain._loop_state)
mixtrain._loop_window = timed("window", mixtrain._loop_window)
native_run = mixtrain._native.run
mixtrain._native.run = timed("native run", native_run)


def doctor():
    model = copy.deepcopy(base).to(torch.bfloat16)
    o = torch.optim.AdamW(model.parameters(), lr=lr)
    python_parts.clear()
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        d = mixtrain.doctor(model, (fx, fy), valid=(vx, vy), optimizer=o, steps=steps, bs=bs, threads=2)
    return time.perf_counter() - start, d, dict(python_parts)


def doctor_from_scratch():
    model = copy.deepcopy(base).to(torch.bfloat16)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        d = mixtrain.doctor(model, (fx, fy), valid=(vx, vy), epochs=1, bs=bs, lr=lr, threads=2)
    return time.perf_counter() - start, d


def train(precision):
    model = copy.deepcopy(base)
    if precision == "bf16-pure":
        model = model.to(torch.bfloat16)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        mixtrain.train(model, (fx, fy), valid=(vx, vy), precision=precision, epochs=1, bs=bs, lr=lr, threads=2)
    return time.perf_counter() - start


own_loop(torch.float32)  # warm-up
rows = {"train fp32": [], "train bf16-pure": [], "own fp32 loop": [], "own bf16 loop": [], "doctor": [],
        "doctor from scratch": []}
last = None
for _ in range(rounds):
    rows["train fp32"].append(train("fp32"))
    rows["train bf16-pure"].append(train("bf16-pure"))
    rows["own fp32 loop"].append(own_loop(torch.float32))
    rows["own bf16 loop"].append(own_loop(torch.bfloat16))
    seconds, d, parts = doctor()
    rows["doctor"].append(seconds)
    last = (d, parts)
    seconds, scratch = doctor_from_scratch()
    rows["doctor from scratch"].append(seconds)
d, parts = last
base_s = statistics.median(rows["train fp32"])
params = sum(p.numel() for p in base.parameters())
print("Encoder d=128 x 2 layers (%d parameters), %d steps of bs %d x 64 tokens, lr %g, torch %s, %d threads, "
      "medians of %d rounds" % (params, steps, bs, lr, torch.__version__, torch.get_num_threads(), rounds))
for name, ts in rows.items():
    med = statistics.median(ts)
    print("  %-19s %7.2f s  %.2fx one fp32 train" % (name, med, med / base_s))
info = d.to_dict()
print("  verdict %s; proven fix %s; trials %d" % (d.verdict, info.get("proven_fix", {}).get("api") if info.get(
    "proven_fix") else None, len(info.get("trials", []))))
print("  the last doctor's Python side: " + ", ".join("%s %.2f s" % kv for kv in parts.items()))
timing = info.get("timing", {})
order = ["setup", "pair", "fp32", "run's setup", "run", "after", "trials"]  # diagnosis.json sorts its keys
print("  its native phases: " + (", ".join("%s %.2f s" % (k, timing[k]) for k in order if k in timing) or
                                 "(none recorded)") +
      "; before them (the branch's setup in run/) %.2f s" % (parts["native run"] - sum(timing.values())))
info = scratch.to_dict()
print("  the doctor from scratch (one-cycle from the same weights, the pair side by side): verdict %s, trials %d; "
      "phases: %s" % (scratch.verdict, len(info.get("trials", [])),
                      ", ".join("%s %.2f s" % (k, info["timing"][k]) for k in ("setup", "pair", "after", "trials")
                                if k in info.get("timing", {}))))
