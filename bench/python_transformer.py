"""The built-in transformer (mixtrain::models::TransformerLM) and its training loop
in PyTorch-Python, for bench/transformer_bench.sh: the same architecture, sizes,
initialization scheme, AdamW settings and batch shapes, on the same threads.

    /usr/bin/python3 bench/python_transformer.py STEPS BATCH THREADS
prints "python_step_ms X".
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        logits = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        y = torch.matmul(torch.softmax(logits.masked_fill(future, float("-inf")), -1), v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


class TransformerLM(nn.Module):
    def __init__(self, vocab=256, context=64, d=128, heads=4, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "ln" not in name:
                    p.normal_(0, 0.02) if p.dim() >= 2 else p.zero_()

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.size(1)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def main():
    steps, batch, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = TransformerLM()
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
