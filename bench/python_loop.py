#!/usr/bin/env python3
"""Baseline (a): the same training as `mixtrain train` in plain PyTorch-Python
(the build's torch, run with .venv/bin/python at its default threads):
same model, data, normalization, AdamW hyper-parameters, fastai's one-cycle
formula per step, batch size and epoch. Prints one JSON line like raw_loop.

    python_loop.py [DATA_DIR] [--compile] [--channels-last]

--compile: the model through torch.compile (inductor, the machine's C++ compiler), compiled
before the timed epoch (its training and validation graphs, on a batch whose effects are undone);
the compile's own time is reported apart as compile_seconds.
--channels-last: the model as PyTorch's channels-last tutorial has it,
model.to(memory_format=torch.channels_last) (mixtrain's built-in CNN runs its activations
channels-last; this is the Python loop that does the same)."""
import gzip, json, math, sys, time
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

args = [a for a in sys.argv[1:] if a not in ("--compile", "--channels-last")]
compiled = "--compile" in sys.argv[1:]
channels_last = "--channels-last" in sys.argv[1:]
data_dir = args[0] if args else "/usr/share/datasets/fashion-mnist"

def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndims = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndims).reshape(dims)

def load(images, labels):
    x = torch.from_numpy(read_idx(f"{data_dir}/{images}").astype(np.float32)).unsqueeze(1)
    x = (x / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(read_idx(f"{data_dir}/{labels}").astype(np.int64))

xt, yt = load("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
xv, yv = load("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")

def cos_sched(a, b, pos): return a + (1 + math.cos(math.pi * (1 - pos))) * (b - a) / 2
def combined(pct, a, b, c, pos): return cos_sched(a, b, pos / pct) if pos < pct else cos_sched(b, c, (pos - pct) / (1 - pct))

torch.manual_seed(42)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
    nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
    nn.Flatten(), nn.Linear(32 * 7 * 7, 10))
if channels_last:
    model = model.to(memory_format=torch.channels_last)
lr_max, bs = 3e-3, 256
opt = torch.optim.AdamW(model.parameters(), lr=lr_max, betas=(0.95, 0.99), eps=1e-5, weight_decay=0.01)
gen = torch.Generator().manual_seed(42)
forward, compile_seconds = model, 0.0
if compiled:
    import copy
    forward = torch.compile(model)
    c0 = time.perf_counter()
    saved = copy.deepcopy(model.state_dict())  # BatchNorm's statistics move in the warm-up
    F.cross_entropy(forward(xt[:bs]), yt[:bs]).backward()
    opt.zero_grad()
    model.eval()
    with torch.no_grad():
        forward(xv[:bs])
        forward(xv[:xv.shape[0] % bs or bs])  # the last, shorter batch: a graph of its own
    model.train()
    model.load_state_dict(saved)
    compile_seconds = time.perf_counter() - c0

t0 = time.perf_counter()
n = xt.shape[0]; steps = n // bs
order = torch.randperm(n, generator=gen)
model.train()
loss_sum = 0.0
for i in range(steps):
    pos = i / steps
    for g in opt.param_groups:
        g["lr"] = combined(0.25, lr_max / 25, lr_max, lr_max / 1e5, pos)
        g["betas"] = (combined(0.25, 0.95, 0.85, 0.95, pos), 0.99)
    idx = order[i * bs:(i + 1) * bs]
    loss = F.cross_entropy(forward(xt[idx]), yt[idx])
    loss.backward()
    opt.step()
    opt.zero_grad()
    loss_sum += loss.item()
model.eval()
correct = 0
with torch.no_grad():
    for s in range(0, xv.shape[0], bs):
        correct += (forward(xv[s:s + bs]).argmax(1) == yv[s:s + bs]).sum().item()
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": round(seconds, 4), "valid_accuracy": correct / xv.shape[0],
                  "train_loss": loss_sum / steps, "threads": torch.get_num_threads(),
                  **({"channels_last": True} if channels_last else {}),
                  **({"compile_seconds": round(compile_seconds, 2)} if compiled else {})}))
