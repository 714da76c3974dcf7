"""torchvision's models for the tests, as TorchScript files. Run with the Python that
has torchvision (.venv-cuda: torch 2.14.1 + torchvision 0.29.1, made by
`scripts/setup.sh --cuda`; PyPI's torchvision does not import beside torch 2.13's CPU
build), the files load in the torch 2.13 that mixtrain builds against:
    .venv-cuda/bin/python tests/python/export_torchvision.py OUT_DIR
"""
import os
import sys

import torch
import torchvision

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def path(name):
    return os.path.join(out, name)


# torchvision's ViT: its attention takes a fused kernel in eval (real CPU bf16 autocast).
torch.manual_seed(7)
vit_b = torchvision.models.VisionTransformer(image_size=32, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32,
                                             mlp_dim=64, num_classes=10)
torch.jit.script(vit_b).save(path("torchvision_vit.pt"))
g = torch.Generator().manual_seed(8)
images = torch.randn(256, 3, 32, 32, generator=g)
classes = torch.randint(0, 10, (256,), generator=g)
torch.save({"x": images[:192], "y": classes[:192], "valid_x": images[192:], "valid_y": classes[192:]},
           path("images32_data.pt"))
print("exported to", out, "with torch", torch.__version__, "torchvision", torchvision.__version__)
