"""Trains a TorchScript model in a plain PyTorch loop, fp32, the way a user would
without mixtrain, and prints its validation accuracy: the bar mixtrain's fp16
training of the same model on the same data must reach.

    .venv/bin/python tests/python/plain_loop.py MODEL.pt DATA.pt EPOCHS BS LR [model|cross_entropy]

DATA.pt has x, y, valid_x, valid_y. The optimizer and schedule are fastai's
defaults as torch spells them: AdamW (betas 0.9/0.99, eps 1e-5, weight decay
0.01) and a one-cycle schedule (25% warm-up, cosine, lr/25 to lr/1e5, beta1
0.95-0.85-0.95). With "model" the model computes its loss from the labels.
"""
import sys

import torch
import torch.nn.functional as F

model_path, data_path, epochs, bs, lr = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
own_loss = len(sys.argv) > 6 and sys.argv[6] == "model"
torch.manual_seed(0)
model = torch.jit.load(model_path)
data = torch.load(data_path)
x, y = data["x"].float(), data["y"]
steps = epochs * (len(x) // bs)
opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), eps=1e-5, weight_decay=0.01)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.25, div_factor=25,
                                            final_div_factor=4000, base_momentum=0.85, max_momentum=0.95)


def prediction(out):
    if isinstance(out, dict):
        return out["logits"]
    if isinstance(out, tuple):
        return [t for t in out if t is not None and t.dim() > 0][0]
    return out


def loss_of(out, labels):
    if not own_loss:
        return F.cross_entropy(prediction(out), labels)
    if isinstance(out, dict):
        return out["loss"]
    return out[0] if isinstance(out, tuple) else out


model.train()
for epoch in range(epochs):
    order = torch.randperm(len(x))
    for i in range(len(x) // bs):  # drop_last, as fastai's training loader
        idx = order[i * bs:(i + 1) * bs]
        out = model(x[idx], y[idx]) if own_loss else model(x[idx])
        loss = loss_of(out, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
model.eval()
with torch.no_grad():
    pred = prediction(model(data["valid_x"].float()))
print("accuracy %.6f" % (pred.argmax(-1) == data["valid_y"]).float().mean().item())
