#!/usr/bin/env python3
"""Writes the scripted_model fuzz target's seeds (real TorchScript files) and the
hostile tester's crafted model: l1.weight's storage record cut from 2560 bytes to
100, every CRC valid (libtorch sized the storage by the pickle's claim and read and
wrote past the record: `free(): invalid size`, or training on heap garbage); and the
same cut in a zip whose records are all deflated (torch deflates code records, never
storage records: those would be inflated into buffers the storage check cannot see, so
such a file is refused).

  .venv/bin/python fuzz/make_scripted_model_seeds.py   (from the repository root)
"""
import io
import os
import sys
import zipfile

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import cut_record  # noqa: E402

torch.manual_seed(0)
seeds = "fuzz/seeds/scripted_model/"
regressions = "fuzz/regressions/scripted_model/"


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(64, 10)  # 640 floats: a 2560-byte record
        self.ln = nn.LayerNorm(10)
        self.l2 = nn.Linear(10, 3)

    def forward(self, x):
        return self.l2(torch.relu(self.ln(self.l1(x))))


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean((2, 3)))


torch.jit.script(TwoLayer()).save(seeds + "two_layer.pt")
torch.jit.script(Conv()).save(seeds + "conv.pt")
cut_record.main(seeds + "two_layer.pt", regressions + "l1-weight-record-cut.pt", 2560, 100)


# The same cut, every record deflated.
zin = zipfile.ZipFile(seeds + "two_layer.pt")
out = io.BytesIO()
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        data = zin.read(item.filename)
        if item.filename.endswith("/data/0"):
            assert len(data) == 2560
            data = data[:100]
        zout.writestr(item.filename, data)
open(regressions + "compressed-record-cut.pt", "wb").write(out.getvalue())
