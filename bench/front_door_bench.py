"""The doctor from Python (mixtrain.doctor on the module object and tensors)
against the CLI (mixtrain doctor on the same model as a TorchScript file and the
same data as a torch.save file): the same C++ underneath, so the goal is a
Python cost within 5% of the CLI's. Rounds are interleaved (this machine is
noisy); the medians are compared.

    PYTHONPATH=build/python .venv/bin/python bench/front_door_bench.py build/tools/mixtrain/mixtrain [ROUNDS]
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

import mixtrain

cli = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
torch.manual_seed(0)


def cnn():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


g = torch.Generator().manual_seed(0)
x = torch.randn(12288, 1, 28, 28, generator=g)
y = (x[:, 0, :14].mean((1, 2)) > x[:, 0, 14:].mean((1, 2))).long() + 2 * (x[:, 0, :, :14].mean((1, 2)) > 0).long()
options = dict(epochs=2, bs=64, lr=3e-3, threads=2)
flags = ["--epochs", "2", "--bs", "64", "--lr", "3e-3", "--threads", "2"]

with tempfile.TemporaryDirectory() as tmp:
    torch.jit.script(cnn()).save(os.path.join(tmp, "cnn.pt"))
    torch.save({"x": x, "y": y}, os.path.join(tmp, "data.pt"))
    times = {"cli": [], "python": []}
    for r in range(rounds):
        start = time.monotonic()
        run = subprocess.run([cli, "doctor", "--model", os.path.join(tmp, "cnn.pt"), "--data", os.path.join(tmp, "data.pt"),
                        "--out", os.path.join(tmp, "cli%d" % r)] + flags, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert run.returncode in (0, 1), "mixtrain doctor failed with exit %d" % run.returncode
        times["cli"].append(time.monotonic() - start)
        model = cnn()
        start = time.monotonic()
        with open(os.devnull, "w") as null:
            saved = sys.stdout
            sys.stdout = null
            try:
                d = mixtrain.doctor(model, (x, y), **options)
            finally:
                sys.stdout = saved
        times["python"].append(time.monotonic() - start)
    cli_s, py_s = statistics.median(times["cli"]), statistics.median(times["python"])
    print("doctor, CNN, %d train samples, 2 epochs x 2 runs (fp32, emulated fp16):" % (len(x) - int(len(x) * 0.2)) + " CLI %.2f s (process start included), Python %.2f s; "
          "Python/CLI = %.3f (goal <= 1.05); verdict %s" % (cli_s, py_s, py_s / cli_s, d.verdict))
    print("rounds: CLI %s, Python %s" % (["%.2f" % t for t in times["cli"]], ["%.2f" % t for t in times["python"]]))
