"""The built-in transformer (mixtrain::models::TransformerLM) and its training loop
in PyTorch-Python, for bench/model_bench.sh: the same architecture, sizes,
initialization scheme, AdamW settings and batch shapes, on the same threads.

    .venv/bin/python bench/python_transformer.py STEPS BATCH THREADS [fp32|bf16|bf16-pure] [compile]
prints "python_step_ms X". bf16: torch.autocast's bf16 forward; bf16-pure: the model in bf16
(model.to(torch.bfloat16)) under torch's AdamW, which rounds at every op: the loop a user writes.
compile: the model through torch.compile (inductor, the machine's C++ compiler); its compile
happens in the warm-up steps, which are not timed.
"""
import contextlib
import sys
import time

import torch
import torch.nn.functional as F

from gpu_python_bench import TransformerLM  # bench/: the same model the GPU check times


def built_in_transformer(layers=2, d=128):
    """mixtrain::models::TransformerLM (its defaults: 2 blocks of width 128, 4 heads) and its
    GPT-2 style initialization."""
    model = TransformerLM(vocab=256, d=d, layers=layers, heads=4, seq=64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0, 0.02) if p.dim() >= 2 else p.zero_()
    return model


def main():
    steps, batch, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    precision = sys.argv[4] if len(sys.argv) > 4 else "fp32"
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = built_in_transformer()
    if precision == "bf16-pure":
        model.to(torch.bfloat16)
    forward = torch.compile(model) if "compile" in sys.argv[5:] else model
    region = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-5, weight_decay=0.01)
    x = torch.randint(0, 256, (batch, 64))
    y = torch.randint(0, 256, (batch, 64))

    def step():
        with region():
            logits = forward(x)
        loss = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    print("python_step_ms %.2f" % (1000 * (time.perf_counter() - start) / steps))


if __name__ == "__main__":
    main()
