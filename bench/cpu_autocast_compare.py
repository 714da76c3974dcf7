"""How torch's own CPU autocast (torch 2.x runs fp16 and bf16 on the CPU) compares with
mixtrain's emulation of CUDA autocast, which is how mixtrain checks fp16 on a CPU:
  1. the op lists: for every op on CUDA autocast's lists (src/amp/autocast_lists.cpp,
     read from the source), what CPU autocast does with it in fp16 and bf16, probed
     on sample tensors: runs it in the low dtype, in fp32, or leaves it alone;
  2. speed: a training step of the reference CNN in fp32, and under CPU autocast in
     bf16 and fp16, in one run (ratios against fp32).
    .venv/bin/python bench/cpu_autocast_compare.py [--steps N] [--threads T]
"""
import argparse
import os
import re
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))


def cuda_lists():
    src = open(os.path.join(here, "..", "src", "amp", "autocast_lists.cpp")).read()
    lists, current = {}, None
    for line in src.splitlines():
        if "kLowerPrecision;" in line or "kFp32;" in line or "kPromote;" in line:
            continue
        for m in re.finditer(r'"([a-z_0-9]+)"', line):
            lists.setdefault(m.group(1), None)
    # Which list each name is on: the block it sits in, in file order.
    order = re.split(r"m\[std::string\(\"aten::\"\) \+ op\] = AutocastList::(\w+);", src)
    named = {}
    for block, kind in zip(order[0::2], order[1::2]):
        for m in re.finditer(r'"([a-z_0-9]+)"', block):
            named[m.group(1)] = {"kLowerPrecision": "lower", "kFp32": "fp32", "kPromote": "promote"}[kind]
    return named


def has_cpu_autocast_kernel(name):
    """Whether any overload of aten::name has an AutocastCPU kernel (None: no such op here)."""
    schemas = torch._C._jit_get_schemas_for_operator("aten::" + name)
    if not schemas:
        return None
    found = False
    for s in schemas:
        try:  # JIT-only overloads (einsum.sublist) are not in the dispatcher
            found |= torch._C._dispatch_has_kernel_for_dispatch_key(
                "aten::" + name + ("." + s.overload_name if s.overload_name else ""), "AutocastCPU")
        except RuntimeError:
            pass
    return found


def x(*shape):
    return torch.randn(*shape)


# Sample calls for the ops whose behaviour this report probes (the rest: kernel present or not).
PROBES = {
    "mm": lambda: torch.mm(x(4, 4), x(4, 4)),
    "matmul": lambda: torch.matmul(x(4, 4), x(4, 4)),
    "bmm": lambda: torch.bmm(x(2, 4, 4), x(2, 4, 4)),
    "addmm": lambda: torch.addmm(x(4), x(4, 4), x(4, 4)),
    "baddbmm": lambda: torch.baddbmm(x(2, 4, 4), x(2, 4, 4), x(2, 4, 4)),
    "linear": lambda: F.linear(x(4, 4), x(4, 4)),
    "conv2d": lambda: F.conv2d(x(1, 2, 5, 5), x(3, 2, 3, 3)),
    "conv1d": lambda: F.conv1d(x(1, 2, 5), x(3, 2, 3)),
    "conv_transpose2d": lambda: F.conv_transpose2d(x(1, 2, 5, 5), x(2, 3, 3, 3)),
    "prelu": lambda: F.prelu(x(2, 3), x(1)),
    "einsum": lambda: torch.einsum("ij,jk->ik", x(4, 4), x(4, 4)),
    "scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(x(1, 2, 4, 8), x(1, 2, 4, 8), x(1, 2, 4, 8)),
    "exp": lambda: torch.exp(x(4)),
    "log": lambda: torch.log(x(4).abs()),
    "pow": lambda: torch.pow(x(4), 2),
    "softmax": lambda: torch.softmax(x(4, 4), -1),
    "log_softmax": lambda: torch.log_softmax(x(4, 4), -1),
    "layer_norm": lambda: F.layer_norm(x(4, 4), (4,)),
    "group_norm": lambda: F.group_norm(x(2, 4, 3), 2),
    "sum": lambda: torch.sum(x(4, 4)),
    "prod": lambda: torch.prod(x(4)),
    "cumsum": lambda: torch.cumsum(x(4), 0),
    "mse_loss": lambda: F.mse_loss(x(4), x(4)),
    "l1_loss": lambda: F.l1_loss(x(4), x(4)),
    "nll_loss": lambda: F.nll_loss(x(4, 3), torch.tensor([0, 1, 2, 0])),
    "cross_entropy_loss": lambda: F.cross_entropy(x(4, 3), torch.tensor([0, 1, 2, 0])),
    "binary_cross_entropy_with_logits": lambda: F.binary_cross_entropy_with_logits(x(4), x(4).sigmoid()),
    "kl_div": lambda: F.kl_div(x(4), x(4)),
    "logsumexp": lambda: torch.logsumexp(x(4, 4), -1),
    "norm": lambda: torch.norm(x(4)),
    "cdist": lambda: torch.cdist(x(3, 4), x(2, 4)),
    "upsample_nearest2d": lambda: F.interpolate(x(1, 1, 2, 2), scale_factor=2),
    "upsample_bilinear2d": lambda: F.interpolate(x(1, 1, 2, 2), scale_factor=2, mode="bilinear"),
    "addcmul": lambda: torch.addcmul(x(4), x(4), x(4)),
    "cat": lambda: torch.cat([x(2), x(2)]),
    "stack": lambda: torch.stack([x(2), x(2)]),
    "dot": lambda: torch.dot(x(4), x(4)),
    "atan2": lambda: torch.atan2(x(4), x(4)),
}


def what_cpu_autocast_does(name, dtype):
    """'low' (runs in dtype), 'fp32' (casts a low input up), or 'leaves' (runs in its inputs' dtype)."""
    if name not in PROBES:
        return None
    with torch.autocast("cpu", dtype=dtype):
        out = PROBES[name]()
    if out.dtype == dtype:
        return "low"
    # An fp32 input stayed fp32: either the fp32 list or no rule. Feed a low input to tell.
    orig = torch.randn
    try:
        globals()["x"] = lambda *s: orig(*s).to(dtype)
        with torch.autocast("cpu", dtype=dtype):
            try:
                out = PROBES[name]()
            except RuntimeError:
                return "fails on a low input"
    finally:
        globals()["x"] = lambda *s: orig(*s)
    return "fp32" if out.dtype == torch.float32 else "leaves"


class Cnn(nn.Module):  # the reference CNN's shape (mixtrain's built-in cnn)
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.b1, self.b2 = nn.BatchNorm2d(16), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))


def step_time(dtype, steps, bs=256):
    torch.manual_seed(0)
    model = Cnn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(bs, 1, 28, 28)
    y = torch.randint(0, 10, (bs,))

    def one():
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = F.cross_entropy(model(data).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(2):
        one()
    t = time.perf_counter()
    for _ in range(steps):
        one()
    return (time.perf_counter() - t) / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s)")
    lists = cuda_lists()
    print("\n## CUDA autocast's lists (what mixtrain emulates) against torch's CPU autocast")
    print("| op | CUDA list | AutocastCPU kernel | CPU fp16 | CPU bf16 |")
    print("|---|---|---|---|---|")
    differ = 0
    for name, kind in lists.items():
        has = has_cpu_autocast_kernel(name)
        fp16, bf16 = what_cpu_autocast_does(name, torch.float16), what_cpu_autocast_does(name, torch.bfloat16)
        expected = {"lower": "low", "fp32": "fp32", "promote": "leaves"}[kind]
        same = bf16 == expected if bf16 is not None else None
        differ += same is False
        mark = "" if same is not False else " **differs**"
        print(f"| {name} | {kind} | {'not an op here' if has is None else 'yes' if has else 'no'} | {fp16 or '-'} | {bf16 or '-'}{mark} |")
    print(f"\nprobed ops whose CPU bf16 behaviour differs from CUDA's list: {differ}")
    print("\n## One training step of the reference CNN (bs 256), torch's CPU autocast")
    base = step_time(None, a.steps)
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        t = base if dtype is None else step_time(dtype, a.steps)
        print(f"{label}: {1000 * t:.1f} ms/step, {t / base:.2f}x fp32")


if __name__ == "__main__":
    main()
