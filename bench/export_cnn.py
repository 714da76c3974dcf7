"""Writes the default CNN (mixtrain::models::simple_cnn) as a TorchScript file,
for bench/model_bench.sh's scripted-vs-native comparison.

    .venv/bin/python bench/export_cnn.py OUT.pt
"""
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
cnn = nn.Sequential(nn.Conv2d(1, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                    nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                    nn.Flatten(), nn.Linear(32 * 7 * 7, 10))
torch.jit.script(cnn).save(sys.argv[1])
