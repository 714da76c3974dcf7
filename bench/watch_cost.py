"""What mixtrain.watch costs a user's own loop: a small transformer classifier (the one in
own_loop_cost.py) as a bf16 model under torch's AdamW; an MLP and mixtrain's built-in CNN (the
same layers, written in PyTorch) in torch's fp16 recipe (fp32 weights, autocast, GradScaler,
AdamW; not the transformer because CPU fp16 autocast runs it at seconds a step); and, given a
file, a TorchScript model taking [N, 3, 32, 32] images in the same fp16 recipe
(tests/python/export_torchvision.py's ViT, exported by torchvision's own Python: the watch sees
it through the op tracer). Each loop unwatched, watched with the default sampling
(every=100: one sampled step in 100, one host read per 100 steps) and with every step sampled
(every=1: the cost of a sampled step). Whole steps, interleaved rounds, medians compared. The
issue's goals: at most 1.02x with the default sampling, at most 1.5x for a sampled step.

    PYTHONPATH=build/python .venv/bin/python bench/watch_cost.py [STEPS] [ROUNDS] [TORCHSCRIPT_FILE]
"""
import copy
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn

import mixtrain
from bench_models import Encoder  # the small transformer classifier

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
scripted = sys.argv[3] if len(sys.argv) > 3 else None
torch.manual_seed(0)
warnings.simplefilter("ignore", mixtrain.MixtrainWarning)


class Mlp(nn.Module):
    def __init__(self, d=512):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, d), nn.GELU(), nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(),
                                 nn.LayerNorm(d), nn.Linear(d, 8))

    def forward(self, x):
        return self.net(x)


def cnn():
    """mixtrain's built-in CNN (src/models/zoo.cpp's simple_cnn), in PyTorch."""
    return nn.Sequential(nn.Conv2d(1, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


tokens = torch.randint(0, 64, (steps, 32, 64))
features = torch.randn(steps, 128, 64)
digits = torch.randn(steps, 64, 1, 28, 28)
images = torch.randn(steps, 64, 3, 32, 32)
y = torch.randint(0, 8, (steps, 128))


def fp16_loop_over(inputs):
    def loop(model, opt, scaler, w):
        for i in range(steps):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(inputs[i]).float(), y[i, :len(inputs[i])])
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return loop


def bf16_loop(model, opt, scaler, w):
    for i in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(tokens[i]).float(), y[i, :32]).backward()
        opt.step()


def timed(loop, model, opt, scaler, every):
    t0 = time.perf_counter()
    if every is None:
        loop(model, opt, scaler, None)
    else:
        with mixtrain.watch(model, opt, scaler, every=every) as w:
            loop(model, opt, scaler, w)
    return (time.perf_counter() - t0) / steps


print("mixtrain.watch's cost, %d steps a round, %d rounds, %d threads, torch %s" % (
    steps, rounds, torch.get_num_threads(), torch.__version__))
loops = [("bf16 transformer (bs 32 x 64 tokens)", bf16_loop, Encoder, torch.bfloat16, False),
         ("fp16 autocast + GradScaler, MLP (bs 128)", fp16_loop_over(features), Mlp, torch.float32, True),
         ("fp16 autocast + GradScaler, built-in CNN (bs 64)", fp16_loop_over(digits), cnn, torch.float32, True)]
if scripted:
    loops.append(("fp16 autocast + GradScaler, TorchScript %s (bs 64)" % scripted, fp16_loop_over(images),
                  lambda: torch.jit.load(scripted), torch.float32, True))
for name, loop, make, dtype, scaled in loops:
    torch.manual_seed(0)
    base = make()
    # Two unwatched arms: their ratio is this machine's noise for the others.
    arms = {"unwatched": None, "watched, every=100": 100, "every step sampled": 1, "unwatched again": None}
    state = {}
    for arm in arms:
        # A loaded ScriptModule's deepcopy holds non-leaf parameters: each arm loads the file again.
        model = (make() if isinstance(base, torch.jit.ScriptModule) else copy.deepcopy(base)).to(dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        scaler = torch.amp.GradScaler("cpu") if scaled else None
        state[arm] = (model, opt, scaler)
    for arm, every in arms.items():  # warm-up
        timed(loop, *state[arm], every)
    times = {arm: [] for arm in arms}
    for _ in range(rounds):
        for arm, every in arms.items():
            times[arm].append(timed(loop, *state[arm], every))
    base_t = statistics.median(times["unwatched"])
    print("  %s, %d parameters" % (name, sum(p.numel() for p in base.parameters())))
    for arm, ts in times.items():
        med = statistics.median(ts)
        print("    %-22s %8.2f ms a step  %.3fx" % (arm, med * 1e3, med / base_t))
