"""A run that goes NaN mid-training in fp16 while fp32 is fine (tests/cli_branch_test.cpp):
a regression whose targets need the last layer's outputs to grow past fp16's 65504 (the
model divides them by 1000 before the loss), so its first epoch trains and a later one
overflows. `.venv/bin/python tests/python/export_growing.py OUT_DIR`; seeded.
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
