"""torch.optim's step with a correctly rounded square root, the reference the optimizer core
equals bitwise.

torch's CPU sqrt goes to MKL's vector math, whose float roots are an ulp off in about 17% of
elements. The core takes the IEEE root (what a CUDA device and torch's own fused CPU kernels
compute): everything else in its step is torch.optim's single-tensor arithmetic. A float's root
taken in double and rounded to float is its correctly rounded root (double holds more than
twice float's 24 bits plus two, so the second rounding cannot move it)."""
import contextlib

import torch

_sqrt, _sqrt_ = torch.Tensor.sqrt, torch.Tensor.sqrt_


def _root(t):
    return _sqrt(t.double()).float() if t.dtype == torch.float32 else _sqrt(t)


def _root_(t):
    return t.copy_(_root(t))


@contextlib.contextmanager
def correctly_rounded_root():
    """Within it, Tensor.sqrt and Tensor.sqrt_ on fp32 tensors round correctly."""
    torch.Tensor.sqrt, torch.Tensor.sqrt_ = _root, _root_
    try:
        yield
    finally:
        torch.Tensor.sqrt, torch.Tensor.sqrt_ = _sqrt, _sqrt_
