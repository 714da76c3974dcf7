"""The branch tests' models and data (tests/cli_branch_test.cpp), seeded:
`.venv/bin/python tests/python/export_branch_models.py OUT_DIR`.
- growing_model.pt / growing.pt: a run that goes NaN mid-training in fp16 while fp32 is fine:
  a regression whose targets need the last layer's outputs to grow past fp16's 65504 (the
  model divides them by 1000 before the loss), so its first epochs train and a later one overflows.
- stalling_model.pt / linear.pt: a bf16-pure run that stalls in its cooldown (below).
"""
import pathlib
import sys

import torch
import torch.nn as nn

folder = pathlib.Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
g = torch.Generator().manual_seed(0)
n, d = 2048, 16
w = torch.randn(d, 1, generator=g)
x = torch.randn(n, d, generator=g)
vx = torch.randn(512, d, generator=g)
# Targets of std ~75: the head must reach ~75,000 before the division, and up to ~236,000.
torch.save({"x": x, "y": x @ w * 20, "valid_x": vx, "valid_y": vx @ w * 20}, str(folder / "growing.pt"))


class Growing(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 64), nn.ReLU())
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(self.body(x)) / 1000.0


torch.manual_seed(0)
torch.jit.script(Growing()).save(str(folder / "growing_model.pt"))


# A bf16-pure run healthy at its peak learning rate that stalls in its cooldown: noise-free
# linear targets, so fp32 keeps improving at the schedule's tiny end while bf16 weights round
# those updates away (LayerNorm's gains, |w| ~ 1, lose first).
x = torch.randn(4096, d, generator=g)
vx = torch.randn(512, d, generator=g)
w = torch.randn(d, 1, generator=g)
torch.save({"x": x, "y": x @ w, "valid_x": vx, "valid_y": vx @ w}, str(folder / "linear.pt"))


class Stalling(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 64), nn.LayerNorm(64), nn.Linear(64, 1))

    def forward(self, x):
        return self.body(x)


torch.manual_seed(0)
torch.jit.script(Stalling()).save(str(folder / "stalling_model.pt"))
