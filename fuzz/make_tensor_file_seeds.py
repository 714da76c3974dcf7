#!/usr/bin/env python3
"""Writes the tensor_file fuzz target's seeds (real torch.save files) and the
crafted files of the hostile test: x claims 300 (or 2,000,000) rows over a
storage of 100. The tests read them from fuzz/regressions/tensor_file/.

  .venv/bin/python fuzz/make_tensor_file_seeds.py   (from the repository root)
"""
import io
import zipfile

import torch

torch.manual_seed(0)
seeds = "fuzz/seeds/tensor_file/"
torch.save({"x": torch.randn(8, 1, 4, 4), "y": torch.randint(0, 3, (8,))}, seeds + "images.pt")
torch.save({"x": [torch.randn(6, 5), torch.randn(6, 2)], "y": torch.randn(6, 1)}, seeds + "two_inputs.pt")
torch.save({"x": torch.randn(6, 3).double(), "y": torch.randint(0, 2, (6,)),
            "valid_x": torch.randn(2, 3).half(), "valid_y": torch.randint(0, 2, (2,))}, seeds + "valid.pt")
# A view: the storage is larger than the tensor, with an offset.
base = torch.randn(40)
torch.save({"x": base[4:34].view(10, 3), "y": torch.zeros(10, dtype=torch.long)}, seeds + "view.pt")


def edit_pickle(src, old, new):
    """The zip torch.save wrote, with one byte string of data.pkl replaced (sizes in the pickle)."""
    zin = zipfile.ZipFile(io.BytesIO(src))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("data.pkl"):
                assert data.count(old) == 1, (old, data)
                data = data.replace(old, new)
            zout.writestr(item, data)
    return out.getvalue()


buf = io.BytesIO()
# 100 rows of 7 and 300 targets: the sizes tuple (100, 7) is pickled as BININT1 100, BININT1 7.
torch.save({"x": torch.randn(100, 7), "y": torch.zeros(300, dtype=torch.long)}, buf)
crafted = edit_pickle(buf.getvalue(), b"K\x64K\x07", b"M\x2c\x01K\x07")  # 100 -> 300 (BININT2)
open("fuzz/regressions/tensor_file/rows-past-storage.pt", "wb").write(crafted)
# And one claiming 2,000,000 rows (BININT).
crafted = edit_pickle(buf.getvalue(), b"K\x64K\x07", b"J\x80\x84\x1e\x00K\x07")
open("fuzz/regressions/tensor_file/rows-far-past-storage.pt", "wb").write(crafted)
# x expanded: stride 0 over 2^40 rows (LONG1), which fits any storage but made contiguous
# needs 30 TB: said as such, not a raw allocation error (the tester's 2^31 rows asked 171 GB).
crafted = edit_pickle(buf.getvalue(), b"K\x64K\x07", b"\x8a\x08\x00\x00\x00\x00\x00\x01\x00\x00K\x07")
crafted = crafted.replace(b"K\x07K\x01", b"K\x00K\x01", 1)
open("fuzz/regressions/tensor_file/stride-0-2e40-rows.pt", "wb").write(crafted)
