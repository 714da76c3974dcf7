"""torch's CPU flash attention, forward and backward, in fp32, in bf16, and on bf16 heads
computed in fp32 and rounded back (what models::TransformerLM does for short sequences on
the CPU). Causal, at torch's default threads; milliseconds per forward + backward.

    .venv/bin/python bench/cpu_attention.py [ROUNDS]
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = [(64, 4, 32, 32), (64, 4, 64, 32), (64, 4, 64, 64), (64, 4, 128, 32), (8, 4, 128, 128),
          (32, 8, 128, 64), (16, 8, 256, 32), (16, 8, 256, 64), (4, 16, 1024, 64)]


def time_attention(shape, dtype, via_fp32, n=5):
    q, k, v = [torch.randn(*shape, dtype=dtype, requires_grad=True) for _ in range(3)]
    grad = torch.randn(*shape, dtype=dtype)

    def run():
        if via_fp32:
            y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).to(dtype)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(grad)

    for _ in range(2):
        run()
    start = time.perf_counter()
    for _ in range(n):
        run()
    return 1000 * (time.perf_counter() - start) / n


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    print("[B, H, T, D]        fp32 ms   bf16 ms   bf16 via fp32 ms   bf16 / via fp32")
    for shape in SHAPES:
        runs = {"fp32": [], "bf16": [], "via": []}
        for _ in range(rounds):  # interleaved
            runs["fp32"].append(time_attention(shape, torch.float32, False))
            runs["bf16"].append(time_attention(shape, torch.bfloat16, False))
            runs["via"].append(time_attention(shape, torch.bfloat16, True))
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"{str(list(shape)):18s} {med['fp32']:8.2f} {med['bf16']:9.2f} {med['via']:12.2f} {med['bf16'] / med['via']:16.2f}x")


if __name__ == "__main__":
    main()
