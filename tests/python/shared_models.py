"""Models the Python tests share (pytest puts this folder on sys.path)."""
import torch
import torch.nn as nn


class Overflowing(nn.Module):
    """A projection whose outputs pass fp16's 65504 on normalized inputs, then normalized."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(20, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 3)
        with torch.no_grad():
            self.proj.weight.mul_(50000)

    def forward(self, x):
        return self.head(self.norm(self.proj(x)))
