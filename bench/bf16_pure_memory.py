"""Peak memory (RSS) of a bf16-pure run against an fp32 run of the same model, each in a
fresh process: an MLP of LAYERS Linear(WIDTH, WIDTH) built in its dtype (fp32, or bf16 for
bf16-pure: what a user who loads a model in bf16 has), trained by Python's mixtrain.train
with AdamW at bs 8 for one short epoch, and the plain fp32 torch loop a user would write (AdamW,
the same batches). The goals: bf16-pure at most 0.7x fp32 on a model whose parameters and
optimizer state dominate its memory ([Your loop]); fp32 mixtrain.train at most 1.1x the plain
loop ([Speed]).

    PYTHONPATH=build/python .venv/bin/python bench/bf16_pure_memory.py [WIDTH] [LAYERS]

Each line also says what the parameters, gradients and AdamW state need at the mode's
widths (fp32: 16 bytes a parameter; bf16-pure: 8), and the run's own bytes-per-parameter
report.
"""
import json
import os
import subprocess
import sys

width = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 8

CHILD = r"""
import json, resource, sys, torch, mixtrain
width, layers, precision = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
dtype = torch.bfloat16 if precision == "bf16-pure" else torch.float32
mods = []
for _ in range(layers):
    mods += [torch.nn.Linear(width, width, dtype=dtype), torch.nn.ReLU()]
model = torch.nn.Sequential(*mods[:-1])
n = sum(p.numel() for p in model.parameters())
x = torch.randn(64, width)
y = torch.randn(64, width)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if precision == "torch-loop":  # the plain fp32 loop a user writes: the peer for fp32's peak
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i in range(0, 64, 8):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[i:i + 8]), y[i:i + 8]).backward()
        opt.step()
    with torch.no_grad():
        model(x[:8])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"params": n, "peak": peak, "before": before, "bytes_per_param": None}))
    sys.exit(0)
r = mixtrain.train(model, (x, y), valid=(x[:8], y[:8]), precision=precision, epochs=1, bs=8, lr=1e-4,
                   loss="mse", threads=1)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"params": n, "peak": peak, "before": before, "bytes_per_param": r.summary.get("bytes_per_param")}))
"""


def measure(precision):
    out = subprocess.run([sys.executable, "-c", CHILD, str(width), str(layers), precision], capture_output=True,
                         text=True, env=dict(os.environ))
    if out.returncode != 0:
        sys.exit(f"{precision}: the run failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


loop = measure("torch-loop")
fp32 = measure("fp32")
pure = measure("bf16-pure")
n = fp32["params"]
print(f"MLP {layers} x Linear({width}, {width}): {n / 1e6:.1f}M parameters, bs 8, AdamW, Python mixtrain.train")
for name, m, need in (("torch loop", loop, 16), ("fp32", fp32, 16), ("bf16-pure", pure, 8)):
    print(f"  {name:<10} peak RSS {m['peak'] / 1e9:.2f} GB (before training {m['before'] / 1e9:.2f} GB; "
          f"weights+grads+AdamW state need {need * n / 1e9:.2f} GB); reported bytes/param {m['bytes_per_param']}")
print(f"  bf16-pure / fp32 peak RSS: {pure['peak'] / fp32['peak']:.2f}x (goal: at most 0.70x)")
print(f"  fp32 mixtrain.train / plain torch fp32 loop peak RSS: {fp32['peak'] / loop['peak']:.2f}x (goal: at most 1.10x)")
