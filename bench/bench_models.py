"""Models the Python benchmarks share (run from the repository root: `python bench/<name>.py`
puts bench/ on the path)."""
import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self, d=256, layers=2):
        super().__init__()
        self.emb = nn.Embedding(64, d)
        self.blocks = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True),
                                            layers)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        return self.head(self.norm(self.blocks(self.emb(x))).mean(1))
