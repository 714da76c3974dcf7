"""Writes the TorchScript models and torch.save data files the bring-your-own-model
tests use, the way a PyTorch user would. Run with Debian's python3-torch:

    .venv/bin/python tests/python/export_models.py OUT_DIR

Everything is seeded, so the files are the same on every run.
"""
import os
import sys

import torch
import torch.nn as nn

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)


def path(name):
    return os.path.join(out, name)


# ---- A model with two inputs: features and a mask over them.
class MaskedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x, mask):
        return self.head(self.body(x * mask))


def masked_data(n):
    x = torch.randn(n, 20)
    mask = (torch.rand(n, 20) > 0.2).float()
    w = torch.randn(20, 3, generator=torch.Generator().manual_seed(1))
    y = ((x * mask) @ w).argmax(1)
    return x, mask, y


torch.jit.script(MaskedMLP()).save(path("two_inputs.pt"))
x, mask, y = masked_data(1024)
vx, vmask, vy = masked_data(256)
torch.save({"x": [x, mask], "y": y, "valid_x": [vx, vmask], "valid_y": vy}, path("two_inputs_data.pt"))


# ---- A conv net with BatchNorm, traced, on 12x12 images of two classes.
class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(16, 2)

    def forward(self, x):
        return self.classifier(self.features(x))


def stripes(n):
    y = torch.randint(0, 2, (n,))
    img = torch.randn(n, 1, 12, 12) * 0.5
    img[y == 1, :, ::3, :] += 1.5  # horizontal stripes
    img[y == 0, :, :, ::3] += 1.5  # vertical stripes
    return (img - img.mean()) / img.std(), y


conv = SmallConvNet()
images, labels = stripes(768)
torch.jit.trace(conv, images[:4]).save(path("traced_conv.pt"))
torch.jit.script(SmallConvNet()).save(path("scripted_conv.pt"))
torch.save({"x": images, "y": labels}, path("stripes_data.pt"))  # no valid: the seeded split


# ---- Self-attention whose logits overflow fp16: q and k are large, their dot products larger.
class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)

    def forward(self, x):
        logits = torch.matmul(self.q(x), self.k(x).transpose(1, 2))
        return torch.matmul(torch.softmax(logits, dim=-1), self.v(x))


class Classifier(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.attn = Attention(d)
        self.head = nn.Linear(d, 4)

    def forward(self, x):  # the residual path lets fp32 learn whatever attention does
        return self.head((x + self.attn(x)).mean(1))


big = Classifier()
with torch.no_grad():  # q and k entries in the tens to hundreds: many logits pass 65504
    big.attn.q.weight.normal_(0, 14)
    big.attn.k.weight.normal_(0, 14)
torch.jit.script(big).save(path("attention_overflow.pt"))
rng = torch.get_rng_state()  # the files below stay as they were
for seed in (1, 2, 3, 4):  # other initial weights: the verdict must not flip with them
    torch.manual_seed(100 + seed)
    other = Classifier()
    with torch.no_grad():
        other.attn.q.weight.normal_(0, 14)
        other.attn.k.weight.normal_(0, 14)
    torch.jit.script(other).save(path("attention_overflow_seed%d.pt" % seed))
torch.set_rng_state(rng)
seq, valid_seq = torch.randn(1024, 8, 32), torch.randn(256, 8, 32)
torch.save({"x": seq, "y": seq.mean(1)[:, :4].argmax(1), "valid_x": valid_seq,
            "valid_y": valid_seq.mean(1)[:, :4].argmax(1)}, path("sequences_data.pt"))

# ---- A ViT-like classifier whose patch embedding overflows fp16 on normalized inputs:
# its conv's weights are large, so patch embeddings pass 65504; the LayerNorm after it
# brings them back, so fp32 (and fp16 with the patch embedding kept in fp32) trains.
class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.self_attention = Attention(d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        x = x + self.self_attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyViT(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.conv_proj = nn.Conv2d(1, d, 4, stride=4)  # 12x12 images: 9 patches
        self.embed_ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList([Block(d)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        x = self.embed_ln(self.conv_proj(x).flatten(2).transpose(1, 2))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x).mean(1))


vit = TinyViT()
with torch.no_grad():
    vit.conv_proj.weight.mul_(50000)
torch.jit.script(vit).save(path("vit_patch_overflow.pt"))

# ---- Structured outputs, as torchvision, torchaudio and Hugging Face models return them.
from typing import Dict, NamedTuple, Tuple


class Outputs(NamedTuple):
    logits: torch.Tensor
    aux: torch.Tensor


class NamedTupleNet(nn.Module):  # GoogLeNet-style: a namedtuple with the prediction first
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)
        self.aux = nn.Linear(32, 3)

    def forward(self, x) -> Outputs:
        h = self.body(x)
        return Outputs(self.head(h), self.aux(h))


class DictNet(nn.Module):  # Hugging Face-style: {"logits": ...}
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.classifier = nn.Linear(32, 3)

    def forward(self, x) -> Dict[str, torch.Tensor]:
        h = self.body(x)
        return {"hidden": h, "logits": self.classifier(h)}


class LengthsNet(nn.Module):  # torchaudio-style: (output, lengths)
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.net(x), torch.full((x.size(0),), x.size(1), dtype=torch.long)


rng = torch.get_rng_state()
torch.jit.script(NamedTupleNet()).save(path("namedtuple_out.pt"))
torch.jit.script(DictNet()).save(path("dict_out.pt"))
torch.jit.script(LengthsNet()).save(path("tuple_lengths_out.pt"))
blob_x = torch.randn(1024, 20)
blob_y = (blob_x @ torch.randn(20, 3, generator=torch.Generator().manual_seed(2))).argmax(1)
torch.save({"x": blob_x, "y": blob_y}, path("blobs_data.pt"))
torch.save({"x": blob_x.half(), "y": blob_y}, path("blobs_half_data.pt"))  # as a mixed-precision pipeline saves it
torch.set_rng_state(rng)

# ---- Bad input.
torch.save(SmallConvNet().state_dict(), path("state_dict.pt"))  # weights, not TorchScript
torch.save({"x": images}, path("no_y.pt"))
torch.save({"x": images, "y": labels[:100]}, path("short_y.pt"))
torch.save({"x": images, "y": [1, 2, 3]}, path("y_not_tensor.pt"))
torch.save({"x": images, "y": images[:, 0, 0, 0]}, path("float_targets.pt"))
torch.save({"x": x, "y": torch.randn(1024, 3)}, path("regression_data.pt"))


class IntParam(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(20, 3)
        self.table = nn.Parameter(torch.arange(3), requires_grad=False)

    def forward(self, x):
        return self.lin(x) + self.table


torch.jit.script(IntParam()).save(path("int_param.pt"))
torch.jit.script(MaskedMLP().body[0]).save(path("linear_20_32.pt"))  # output 32 wide: does not fit 3 classes

# ---- Models that compute their own loss, as Hugging Face's do when given labels.
from typing import Optional
import torch.nn.functional as F


class HfDictLoss(nn.Module):  # {"logits": ..., "loss": ...} given labels
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.classifier = nn.Linear(32, 3)

    def forward(self, x, labels: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
        out = {"logits": self.classifier(self.body(x))}
        if labels is not None:
            out["loss"] = F.cross_entropy(out["logits"], labels)
        return out


class HfTupleLoss(nn.Module):  # return_dict=False: (loss, logits) given labels
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.classifier = nn.Linear(32, 3)

    def forward(self, x, labels: Optional[torch.Tensor] = None) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
        logits = self.classifier(self.body(x))
        loss: Optional[torch.Tensor] = None
        if labels is not None:
            loss = F.cross_entropy(logits, labels)
        return loss, logits


class LossOnly(nn.Module):  # returns nothing but its loss
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x, labels):
        return F.cross_entropy(self.net(x), labels)


class OverflowDict(nn.Module):  # a dict output whose projection overflows fp16 on normalized inputs
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(20, 32)
        self.norm = nn.LayerNorm(32)
        self.classifier = nn.Linear(32, 3)

    def forward(self, x) -> Dict[str, torch.Tensor]:
        return {"logits": self.classifier(self.norm(self.proj(x)))}


class TakesLabelsNoLoss(nn.Module):  # takes labels but never returns a loss
    def __init__(self):
        super().__init__()
        self.classifier = nn.Linear(20, 3)

    def forward(self, x, labels: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
        return {"logits": self.classifier(x)}


torch.manual_seed(5)
torch.jit.script(TakesLabelsNoLoss()).save(path("labels_no_loss.pt"))
torch.jit.script(HfDictLoss()).save(path("hf_dict_loss.pt"))
torch.jit.script(HfTupleLoss()).save(path("hf_tuple_loss.pt"))
torch.jit.script(LossOnly()).save(path("loss_only.pt"))
torch.jit.script(DictNet()).save(path("dict_out_plain.pt"))  # the dict model for the plain-loop comparison
overflow = OverflowDict()
with torch.no_grad():
    overflow.proj.weight.mul_(50000)
torch.jit.script(overflow).save(path("dict_overflow.pt"))
# The blobs with a validation set of their own, so a plain PyTorch loop sees the same split.
torch.save({"x": blob_x[:768], "y": blob_y[:768], "valid_x": blob_x[768:], "valid_y": blob_y[768:]}, path("blobs_split.pt"))

# ---- Real CPU bf16 (torchvision's ViT: export_torchvision.py): a model that fills an
# fp32 buffer in place with an autocast (bf16) result, as
# message passing does: libtorch's CPU autocast cannot run it, torch.autocast neither.
class ScatterSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(20, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.proj(x)
        pooled = torch.zeros(h.size(0), 16, device=x.device).index_add_(0, torch.arange(h.size(0), device=x.device), h)
        return self.head(torch.relu(pooled))


torch.manual_seed(6)
torch.jit.script(ScatterSum()).save(path("scatter_sum.pt"))


class ScatterInEval(ScatterSum):  # the same gap, met only when validating: the fallback comes an epoch in
    def forward(self, x):
        h = self.proj(x)
        if not self.training:
            h = torch.zeros(h.size(0), 16, device=x.device).index_add_(0, torch.arange(h.size(0), device=x.device), h)
        return self.head(torch.relu(h))


torch.manual_seed(6)
torch.jit.script(ScatterInEval()).save(path("scatter_in_eval.pt"))


# ---- An Embedding with huge weights feeding an LSTM: fp32 until the LSTM, which a GPU runs in fp16.
class EmbeddingLstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.rnn = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, 4)
        with torch.no_grad():
            self.emb.weight.mul_(1e5)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h[:, -1])


torch.manual_seed(9)
torch.jit.script(EmbeddingLstm()).save(path("embedding_lstm_overflow.pt"))
tokens = torch.randint(0, 50, (512, 12), generator=torch.Generator().manual_seed(10))
torch.save({"x": tokens[:384], "y": tokens[:384, -1] % 4, "valid_x": tokens[384:], "valid_y": tokens[384:, -1] % 4},
           path("tokens_data.pt"))
print("exported to", out)
