"""Loads a model mixtrain wrote (OUT/model.pt) with torch.jit.load and prints its
accuracy on a data file's validation set: proof that Python reads what mixtrain trains.

    .venv/bin/python tests/python/eval_model.py MODEL.pt DATA.pt
"""
import sys

import torch

model = torch.jit.load(sys.argv[1])
model.eval()
data = torch.load(sys.argv[2])
x = data["valid_x"]
inputs = list(x) if isinstance(x, (list, tuple)) else [x]
with torch.no_grad():
    pred = model(*inputs)
print("accuracy %.6f" % (pred.argmax(-1) == data["valid_y"]).float().mean().item())
