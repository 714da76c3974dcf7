"""What one training step of a plain PyTorch-Python loop dispatches, the peer of
bench/step_ops.cpp: top-level ATen ops counted by a TorchDispatchMode (below
autograd; an op's inner calls are not counted again), and CPU allocations counted by
torch's profiler (profile_memory=True: the allocator's reports, the hook step_ops
counts in C++). The loops are bench/python_loop.py's CNN step and
bench/python_transformer.py's, with torch's default optimizer settings.

    .venv/bin/python bench/python_step_ops.py MODEL BATCH [fp32|fp16|bf16|bf16-pure] [--steps N] [--names]
        [--image CxHxW] [--matmul] [--threads N] [--time-only]
MODEL: cnn | mlp | transformer | transformer:LxD (the built-in transformer with L blocks of
width D, as step_ops builds it) | resnet18 (torchvision's ResNet-18, written out here because
torchvision does not import beside torch 2.13's CPU wheel; step_ops trains the same network
exported from torchvision as TorchScript).
Prints one JSON line: a step's time split into phases (the mean of STEPS steps after 3 warm-up
ones, at torch's default threads or --threads), then the ops and allocations of one more step.
--time-only: no count. peak_rss_mb is the process's peak after the timed steps, before any
counting or profiling; start_rss_mb before the model (torch imported, the 30 MiB block below
touched and freed).
--matmul: STEPS more steps under torch's profiler, timing the matrix products (MATRIX_PRODUCTS,
outermost only, as step_ops times them); prints their mean a step, the profiled step's time and
the rest of it (bench/step_ops.cpp says why both from one run).
"""
import collections
import contextlib
import json
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._C._profiler import _EventType

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gpu_python_bench import CountOps  # noqa: E402
from python_transformer import built_in_transformer  # noqa: E402

# The ops whose kernels are the matrix products (bench/step_ops.cpp's kMatrixProducts).
MATRIX_PRODUCTS = {
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution", "aten::convolution_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}


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


def mlp():
    """mixtrain::models::mlp()."""
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 256), nn.ReLU(), nn.Linear(256, 10))


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: the same layers, names and order."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    """torchvision.models.resnet18(num_classes=10): its state_dict's names and shapes."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        for i, (cin, cout, stride) in enumerate(widths, 1):
            setattr(self, f"layer{i}", nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def split_at_matmuls(events):
    """The time of the profiled MATRIX_PRODUCTS not inside another one, and each other op's
    own time outside them by name, in us."""
    total, outside = 0.0, collections.Counter()
    for e in events:
        parent = e.cpu_parent
        while parent is not None and parent.name not in MATRIX_PRODUCTS:
            parent = parent.cpu_parent
        if parent is not None:
            continue
        if e.name in MATRIX_PRODUCTS:
            total += e.time_range.elapsed_us()
        else:
            outside[e.name] += e.self_cpu_time_total
    return total, outside


def rss_mb():
    """The process's peak resident memory so far, in MB (step_ops reads the same)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    name, batch = sys.argv[1], int(sys.argv[2])
    precision = sys.argv[3] if len(sys.argv) > 3 and not sys.argv[3].startswith("--") else "fp32"
    # glibc maps every large block anew until the process frees one; the Learner sets its
    # thresholds (settle_malloc_for_training), and a loop that loaded its data has slid
    # them there: free one large block first, as such a loop has.
    torch.empty(30 << 20, dtype=torch.uint8).fill_(0)  # allocated, touched and freed
    start_rss = rss_mb()  # the block above is in it: no part of the training
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 20
    if "--threads" in sys.argv:
        torch.set_num_threads(int(sys.argv[sys.argv.index("--threads") + 1]))
    n = (4 + steps) * batch
    torch.manual_seed(0)
    image = [1, 28, 28]
    if "--image" in sys.argv:
        text = sys.argv[sys.argv.index("--image") + 1]
        if not all(v.isdigit() and int(v) > 0 for v in text.split("x")):
            sys.exit(f"python_step_ops.py: '{text}' is not a shape like 3x32x32")
        image = [int(v) for v in text.split("x")]
    betas = (0.9, 0.99)
    if name in ("cnn", "mlp", "resnet18"):
        model = {"cnn": cnn, "mlp": mlp, "resnet18": ResNet18}[name]()
        x, y = torch.randn(n, *image), torch.randint(0, 10, (n,))
        if name == "cnn":
            betas = (0.95, 0.99)
    elif name == "transformer" or name.startswith("transformer:"):
        spec = name.partition(":")[2].split("x")
        if ":" in name and not (len(spec) == 2 and all(v.isdigit() and int(v) > 0 for v in spec)):
            sys.exit(f"python_step_ops.py: '{name}' is not transformer:LAYERSxWIDTH")
        model = built_in_transformer(int(spec[0]), int(spec[1])) if ":" in name else built_in_transformer()
        x, y = torch.randint(0, 256, (n, 64)), torch.randint(0, 256, (n, 64))
    else:
        sys.exit(f"python_step_ops.py: unknown model '{name}' (cnn, mlp, resnet18, transformer, transformer:LxD)")
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
    step_ms = sum(phases.values()) / steps
    out = {"model": name, "precision": precision, "loop": "python", "step_ms": round(step_ms, 3),
           "phases_ms": {k: round(v / steps, 6) for k, v in phases.items()},
           "start_rss_mb": round(start_rss, 1), "peak_rss_mb": round(rss_mb(), 1)}
    if "--matmul" in sys.argv:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for i in range(warmup, warmup + steps):
                step(i)
            profiled_ms = 1000 * (time.perf_counter() - start) / steps
        total, outside = split_at_matmuls(prof.events())
        per_step = total / 1000 / steps
        out.update({"matmul_ms": round(per_step, 3), "outside_matmul_ms": round(profiled_ms - per_step, 3),
                    "profiled_step_ms": round(profiled_ms, 3),
                    "outside_top_ms": {k: round(v / 1000 / steps, 3) for k, v in outside.most_common(8)}})
    if "--time-only" in sys.argv:
        print(json.dumps(out))
        return
    ops = CountOps()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        with ops:
            step(warmup + steps)
    sizes = allocations(prof.profiler.kineto_results.experimental_event_tree())
    # The counting mode's own profiler scopes are not the step's.
    names = {k: v for k, v in ops.names.items() if not k.startswith("profiler::")}
    out.update({"ops": sum(names.values()), "allocations": len(sizes), "allocated_mb": round(sum(sizes) / 1e6, 1)})
    if "--names" in sys.argv:
        out["names"] = dict(sorted(names.items()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
