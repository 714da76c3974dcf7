#!/usr/bin/env python3
"""Would a fused GELU whose backward writes into its own saved input shorten the small GPT's
step? torch's gelu_backward allocates its result; a custom autograd function that owns the
pre-activation could write the gradient over it instead (the same kernel, so the same bits),
saving a fresh [2048, 1024] buffer a layer. This times the two on the GPT's shape (bs 32 x 64
tokens, 4 x d 256's fc1), fp32, 1 thread, each call on buffers not touched for 23 calls (so
out of cache, as in a step), ROUNDS rounds of 48 calls, medians.

    .venv/bin/python bench/gelu_backward_in_place.py [ROUNDS]

Prints one JSON line a round: ms a call out of place and written into the input."""
import json, sys, time
import torch

def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    torch.set_num_threads(1)
    torch.manual_seed(0)
    k = 24  # 24 pairs of 8 MB buffers: each call's operands are cold
    xs = [torch.randn(2048, 1024) * 0.5 for _ in range(k)]
    dys = [torch.randn(2048, 1024) * 1e-6 for _ in range(k)]

    def median_ms(in_place, calls=48):
        times = []
        for i in range(calls):
            x, dy = xs[i % k], dys[i % k]
            start = time.perf_counter()
            if in_place:
                torch.ops.aten.gelu_backward.grad_input(dy, x, grad_input=x)
            else:
                torch.ops.aten.gelu_backward(dy, x)
            times.append(time.perf_counter() - start)
        times.sort()
        return times[len(times) // 2] * 1e3

    for _ in range(rounds):
        print(json.dumps({"out_of_place_ms": round(median_ms(False), 3), "into_input_ms": round(median_ms(True), 3)}))

if __name__ == "__main__":
    main()
