"""mixtrain.keep_fp32: fp32 islands for any model in the user's own loop (bf16 models and
torch.autocast alike), and their undoing."""
import copy

import pytest
import torch
import torch.nn as nn

import mixtrain
from shared_models import Overflowing  # tests/python/shared_models.py


def blobs(n=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    return x, (x @ torch.randn(20, 3, generator=torch.Generator().manual_seed(2))).argmax(1)


def fp16_steps(model, batches, opt, scaler):
    """The user's fp16 loop, as torch 2.13 runs it on the CPU: autocast and a GradScaler."""
    losses = []
    for xb, yb in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(xb), yb)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses


def fp16_loop(model, steps=20):
    x, y = blobs()
    return fp16_steps(model, [(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(steps)],
                      torch.optim.AdamW(model.parameters(), lr=1e-3), torch.amp.GradScaler("cpu"))


def test_an_island_makes_an_overflowing_fp16_loop_train_finite():
    torch.manual_seed(0)
    assert not all(map(lambda v: v == v and abs(v) != float("inf"), fp16_loop(Overflowing())))  # NaN/inf without it
    torch.manual_seed(0)
    model = Overflowing()
    islands = mixtrain.keep_fp32(model, ["proj"])
    losses = fp16_loop(model)
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0]
    assert model.proj.weight.dtype == torch.float32
    islands.remove()


def test_a_bf16_model_keeps_its_islands_in_fp32_and_gives_back_its_dtype():
    model = Overflowing().to(torch.bfloat16)
    with torch.no_grad():
        model.proj.weight.div_(50000)
    x, _ = blobs(8)
    islands = mixtrain.keep_fp32(model, ["norm"])
    assert model.norm.weight.dtype == torch.float32 and model.proj.weight.dtype == torch.bfloat16
    h = model.proj(x.to(torch.bfloat16))
    # The island computes in fp32 (its input cast up, its fp32 weights) and hands bf16 on, as it came in.
    expected = nn.functional.layer_norm(h.float(), (32,), model.norm.weight, model.norm.bias).to(torch.bfloat16)
    assert torch.equal(model.norm(h), expected)
    assert model(x.to(torch.bfloat16)).dtype == torch.bfloat16
    assert "Fp32Islands norm" in repr(islands)
    islands.remove()
    assert model.norm.weight.dtype == torch.bfloat16
    assert "forward" not in model.norm.__dict__
    islands.remove()  # twice is no error


def test_patterns_and_bad_names():
    class Blocks(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)) for _ in range(3)])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    model = Blocks().to(torch.bfloat16)
    with mixtrain.keep_fp32(model, "blocks.*.1") as islands:
        assert islands.names == ["blocks.0.1", "blocks.1.1", "blocks.2.1"]
        assert all(model.blocks[i][1].weight.dtype == torch.float32 for i in range(3))
        with pytest.raises(ValueError, match="already kept in fp32"):
            mixtrain.keep_fp32(model, ["blocks.0.1"])
    assert all(model.blocks[i][1].weight.dtype == torch.bfloat16 for i in range(3))
    with pytest.raises(ValueError, match=r"the model has no module 'head'; its modules: blocks, blocks\.0"):
        mixtrain.keep_fp32(model, ["head"])
    for nothing in ([], None):
        with pytest.raises(ValueError, match="keep_fp32 takes module names"):
            mixtrain.keep_fp32(model, nothing)
    with pytest.raises(ValueError, match="eager torch.nn.Module"):
        mixtrain.keep_fp32(torch.jit.script(nn.Linear(2, 2)), ["x"])


def test_the_doctor_from_an_fp16_loop_proves_the_island_and_hands_over_the_line():
    torch.manual_seed(0)
    model = Overflowing()
    x, y = blobs(2048)
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, len(x), 32)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    fp16_steps(model, batches[:4], opt, scaler)  # the user's loop: every step overflows and is skipped
    d = mixtrain.doctor(model, iter(batches[4:]), optimizer=opt, scaler=scaler, steps=16, threads=1)
    assert d.verdict == "forward_overflow", d.report
    assert d.proven_fix is not None, d.report
    assert d.loop_lines == ["islands = mixtrain.keep_fp32(model, ['proj'])  # once, before the loop"], d.loop_lines
    assert "in your loop:\n  islands = mixtrain.keep_fp32(model, ['proj'])" in d.report
    # The loop runs the line and goes on, finite.
    pasted = eval(d.loop_lines[0].split("=", 1)[1].split("#")[0], {"mixtrain": mixtrain, "model": copy.deepcopy(model)})
    assert isinstance(pasted, mixtrain.Fp32Islands)
    assert d.apply(model, opt) is opt  # the same line, done for you: the optimizer needs no change
    losses = fp16_steps(model, batches[20:40], opt, scaler)
    assert all(torch.isfinite(torch.tensor(losses))), losses
    d.islands.remove()
    with pytest.raises(ValueError, match="apply: optimizer must be a torch.optim optimizer, got str"):
        d.apply(model, "adamw")
