#!/usr/bin/env python3
"""The Python side of the GPU check: the same three models as bench/gpu_bench.cpp,
trained with a plain torch.amp loop (autocast + GradScaler, AdamW), one JSON object
per line. Runs on CPU too (--device cpu --tiny) so that CI can test it.

  gpu_python_bench.py [--device cuda|cpu] [--models cnn,resnet,transformer]
                      [--precisions fp32,tf32,fp16,bf16] [--steps N] [--warmup N] [--tiny] [--json PATH]
"""
import argparse
import collections
import contextlib
import json
import sys
import time

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


class CountOps(TorchDispatchMode):
    """Counts the ATen ops dispatched below autograd, by name (an op's inner calls are not
    counted again): what bench/step_ops.cpp and gpu_bench count in C++."""

    def __init__(self):
        super().__init__()
        self.names = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names[func.overloadpacket._qualified_op_name] += 1
        return func(*args, **(kwargs or {}))


def resnet(width):
    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = nn.Conv2d(cin, cout, 1, stride, bias=False)

        def forward(self, x):
            return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + self.shortcut(x))

    w = width
    return nn.Sequential(nn.Conv2d(3, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                         Block(w, 2 * w, 2), Block(2 * w, 4 * w, 2), Block(4 * w, 8 * w, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, 10))


class Attention(nn.Module):
    """mixtrain::models::CausalSelfAttention: one qkv linear, fused causal SDPA, a projection."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        if hasattr(nn.functional, "scaled_dot_product_attention"):  # torch 2.x, as mixtrain's compat seam
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13 (the CPU smoke test)
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            logits = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / (q.size(-1) ** 0.5))
            y = torch.matmul(torch.softmax(logits.masked_fill(future, float("-inf")), -1), v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.fc2(nn.functional.gelu(self.fc1(self.ln2(h))))


class TransformerLM(nn.Module):
    """mixtrain::models::TransformerLM (GPT-style, pre-norm), the built-in transformer at larger sizes."""

    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.size(1), device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def workload(name, tiny):
    if name == "cnn":
        b = 8 if tiny else 256
        model = nn.Sequential(nn.Conv2d(1, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                              nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                              nn.Flatten(), nn.Linear(32 * 7 * 7, 10))
        return model, torch.randn(b, 1, 28, 28), torch.randint(10, (b,)), nn.functional.cross_entropy, b
    if name == "resnet":
        b, side = (4, 32) if tiny else (256, 128)
        return resnet(8 if tiny else 32), torch.randn(b, 3, side, side), torch.randint(10, (b,)), \
            nn.functional.cross_entropy, b
    vocab, d, layers, heads, seq, b = (128, 32, 2, 4, 16, 2) if tiny else (8192, 1024, 6, 16, 1024, 8)
    tokens = torch.randint(vocab, (b, seq + 1))

    def lm_loss(logits, target):
        return nn.functional.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))
    return TransformerLM(vocab, d, layers, heads, seq), tokens[:, :seq], tokens[:, 1:], lm_loss, b


def run_one(args, name, precision):
    device = torch.device(args.device)
    torch.manual_seed(0)
    model, x, y, loss_fn, batch = workload(name, args.tiny)
    model.to(device).train()
    x, y = x.to(device), y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), eps=1e-5, weight_decay=0.01)
    dtype = {"fp32": None, "tf32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    # tf32: fp32 storage, TensorFloat-32 matmuls and convolutions (the GPU baseline the goals use).
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    scaler = torch.amp.GradScaler(args.device, enabled=precision == "fp16") if hasattr(torch.amp, "GradScaler") \
        else torch.cuda.amp.GradScaler(enabled=precision == "fp16" and args.device == "cuda")

    def step():
        region = torch.autocast(args.device, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with region:
            out = model(x)
        loss = loss_fn(out.float(), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    ops = CountOps()  # one more step, counted after the timing (counting observes every op)
    with ops:
        step()
    return {"model": name, "precision": precision, "device": args.device, "batch": batch, "steps": args.steps,
            "tiny": args.tiny, "seconds": seconds, "step_ms": 1000 * seconds / args.steps,
            "steps_per_second": args.steps / seconds, "samples_per_second": args.steps * batch / seconds,
            "final_loss": loss.item(), "peak_memory_bytes": peak, "ops_per_step": sum(ops.names.values()),
            "torch": torch.__version__}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--models", default="cnn,resnet,transformer")
    p.add_argument("--precisions", default="fp32,tf32,fp16,bf16")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    models, precisions = args.models.split(","), args.precisions.split(",")
    for m in models:
        if m not in ("cnn", "resnet", "transformer"):
            p.error(f"unknown model '{m}' (cnn, resnet, transformer)")
    for q in precisions:
        if q not in ("fp32", "tf32", "fp16", "bf16"):
            p.error(f"unknown precision '{q}' (fp32, tf32, fp16, bf16)")
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but no GPU is visible")
    out = open(args.json, "w") if args.json else sys.stdout
    failures = 0
    for m in models:
        for q in precisions:
            try:
                r = run_one(args, m, q)
            except Exception as e:  # one failing configuration must not hide the others
                r = {"model": m, "precision": q, "device": args.device, "error": str(e).splitlines()[0]}
                failures += 1
            out.write(json.dumps(r) + "\n")
            out.flush()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
