"""The built-in transformer (mixtrain::models::TransformerLM) and its training loop
in PyTorch-Python, for bench/model_bench.sh: the same architecture, sizes,
initialization scheme, AdamW settings and batch shapes, on the same threads.

    .venv/bin/python bench/python_transformer.py STEPS BATCH THREADS
prints "python_step_ms X".
"""
import sys
import time

import torch
import torch.nn.functional as F

from gpu_python_bench import TransformerLM  # bench/: the same model the GPU check times


def built_in_transformer():
    """mixtrain::models::TransformerLM's defaults and its GPT-2 style initialization."""
    model = TransformerLM(vocab=256, d=128, layers=2, heads=4, seq=64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0, 0.02) if p.dim() >= 2 else p.zero_()
    return model


def main():
    steps, batch, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = built_in_transformer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-5, weight_decay=0.01)
    x = torch.randint(0, 256, (batch, 64))
    y = torch.randint(0, 256, (batch, 64))

    def step():
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
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
