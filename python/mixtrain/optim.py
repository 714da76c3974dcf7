"""mixtrain's optimizers for your own loop: AdamW, Adam and SGD over parameters (and their
state) stored in any dtype, each update computed in fp32 and written back once by a rule:

- ``weight_update="nearest"``: rounded to the nearest representable value (what a bf16
  model under torch.optim does, except that here the arithmetic is fp32's);
- ``"stochastic"``: rounded up or down with the probabilities that make it unbiased, so an
  update below bf16's spacing lands in expectation instead of never (no extra memory);
- ``"kahan"``: what rounding drops is kept in a bf16 compensation buffer and added to the next
  update (2 more bytes a parameter).

The doctor's ``lost_updates`` cure, proven on your loop's state, is one line::

    opt = mixtrain.optim.from_torch(opt, weight_update="stochastic")

They are ``torch.optim.Optimizer`` subclasses: param groups, ``zero_grad``, torch's LR
schedulers, ``torch.amp.GradScaler.step(opt)``, and ``state_dict()`` in torch's own key layout
(a ``torch.optim.AdamW``'s state loads into ``mixtrain.optim.AdamW`` and back). In fp32 with
``"nearest"`` each step is bitwise torch's single-tensor implementation (the one torch runs
on the CPU). ``opt.lost_updates()`` counts the element updates that rounded to no change.

Here the update runs as torch ops on each parameter (a Python loop over tensors); the
doctor's and the Learner's bf16-pure pass in C++ rounds by the same rules.
"""
import math

import torch

__all__ = ["AdamW", "Adam", "SGD", "from_torch", "WEIGHT_UPDATES"]

WEIGHT_UPDATES = ("nearest", "stochastic", "kahan")


def _check_rule(weight_update):
    if weight_update not in WEIGHT_UPDATES:
        raise ValueError("unknown weight_update=%r (choices: %s)" % (weight_update, ", ".join(WEIGHT_UPDATES)))


def _check_params(groups, weight_update):
    for group in groups:
        params = group["params"]
        for p in [params] if isinstance(params, torch.Tensor) else params:
            if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
                p = p[1]  # a named parameter
            if not isinstance(p, torch.Tensor):
                raise ValueError("an optimizer's parameters are tensors, got %s" % type(p).__name__)
            if not p.is_leaf:
                raise ValueError("a parameter of shape %s is not a leaf tensor (it is computed from others): optimize "
                                 "the tensors it is computed from, or detach().requires_grad_() it" % (tuple(p.shape),))
            if not p.is_floating_point():
                raise ValueError("a parameter is %s: only floating-point parameters are optimized" % p.dtype)
            if p.dtype == torch.float16 and weight_update != "nearest":
                raise ValueError("weight_update=%r rounds bf16 weights; fp16 parameters take 'nearest' only (for fp16, "
                                 "train fp32 parameters under torch.autocast with a GradScaler)" % weight_update)


_MASK_HIGH16 = ~0xFFFF  # 0xffff0000 as an int32: the bits a bf16 keeps


def _stochastic_bf16(x32, generator):
    """x32 rounded to bf16 stochastically: 16 random low bits added below the kept ones carry
    into them with probability (dropped bits) / 2^16. inf and NaN round to nearest."""
    bits = x32.view(torch.int32)
    noise = torch.randint(0, 1 << 16, x32.shape, dtype=torch.int32, device=x32.device, generator=generator)
    carried = ((bits + noise) & _MASK_HIGH16).view(torch.float32)
    return torch.where(torch.isfinite(x32), carried, x32).to(torch.bfloat16)


class _RoundedOptimizer(torch.optim.Optimizer):
    """The shared part: each parameter's step computed in fp32 on fp32 copies of it and of its
    state (or in place, for fp32 storage), then written back once: the parameter by the rule,
    its state to nearest, and the lost element updates counted."""

    def __init__(self, params, defaults, weight_update, seed):
        _check_rule(weight_update)
        self.weight_update = weight_update
        self.seed = int(seed)
        params = list(params)
        # Said in our words before torch's own check ("can't optimize a non-leaf Tensor").
        _check_params([g if isinstance(g, dict) else {"params": [g]} for g in params], weight_update)
        super().__init__(params, defaults)
        _check_params(self.param_groups, weight_update)
        self._lost = {}  # parameter index -> [intended, lost] since the last lost_updates()

    def _rule_for(self, p):
        return "nearest" if p.dtype == torch.float32 else self.weight_update

    def _write_back(self, p, index, old32, new32, state):
        """new32 into p by the rule (a 16-bit parameter); counts what rounded away."""
        rule = self._rule_for(p)
        if p.dtype == torch.float32:
            return  # updated in place, as torch updates it
        if rule == "nearest":
            p.copy_(new32)
            out32 = p.float()
        elif rule == "stochastic":
            g = torch.Generator(device=p.device)
            g.manual_seed((self.seed * 1000003 + index * 7919 + int(state["step"].item())) % (1 << 63))
            p.copy_(_stochastic_bf16(new32, g))
            out32 = p.float()
        else:  # kahan: the update plus what earlier roundings dropped
            comp = state.get("kahan_comp")
            if comp is None:
                comp = state["kahan_comp"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            target = old32 + ((new32 - old32) + comp.float())
            p.copy_(target)
            out32 = p.float()
            comp.copy_(target - out32)
        intended = new32 != old32
        counts = self._lost.setdefault(index, [0, 0])
        counts[0] += int(intended.sum())
        counts[1] += int((intended & (out32 == old32)).sum())

    def lost_updates(self):
        """Since the last call: {"fraction": lost / intended over every parameter, "per_param":
        {name or index: fraction}} of element updates that rounded to no change (under
        "stochastic" in a step, not in expectation; under "kahan" kept in the compensation)."""
        names = {}
        for group in self.param_groups:
            for i, p in enumerate(group["params"]):
                group_names = group.get("param_names")
                names[self._index(p)] = group_names[i] if group_names else self._index(p)
        intended = sum(c[0] for c in self._lost.values())
        lost = sum(c[1] for c in self._lost.values())
        out = {"fraction": lost / intended if intended else 0.0, "weight_update": self.weight_update,
               "per_param": {names.get(i, i): (c[1] / c[0] if c[0] else 0.0) for i, c in self._lost.items()}}
        self._lost = {}
        return out

    def _index(self, p):
        if not hasattr(self, "_indices") or len(self._indices) != sum(len(g["params"]) for g in self.param_groups):
            self._indices = {id(q): i for i, q in enumerate(q for g in self.param_groups for q in g["params"])}
        return self._indices[id(p)]

    def _fp32(self, t):
        return t if t.dtype == torch.float32 else t.float()

    def _in_fp32(self, p, group):
        """The gradient (negated to maximize), the parameter to update and its old value, in
        fp32: fp32 storage is updated in place, as torch does (its old value is not kept: it
        rounds nothing away), other storage on fp32 copies."""
        grad = self._fp32(p.grad)
        if group["maximize"]:
            grad = -grad
        if p.dtype == torch.float32:
            return grad, p, None
        return grad, p.float(), p.float()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("mixtrain's optimizers take dense gradients")
                self._step_one(p, group, self.state[p], self._index(p))
        return loss


class Adam(_RoundedOptimizer):
    """torch.optim.Adam's update (amsgrad, weight decay added to the gradient, or decoupled as
    AdamW's), computed in fp32 and written back by `weight_update`."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 maximize=False, decoupled_weight_decay=False, weight_update="nearest", seed=0):
        if not 0.0 <= lr:
            raise ValueError("invalid lr=%r: >= 0" % (lr,))
        if not 0.0 <= eps:
            raise ValueError("invalid eps=%r: >= 0" % (eps,))
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError("invalid betas=%r: each in [0, 1)" % (betas,))
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults, weight_update, seed)

    def _step_one(self, p, group, state, index):
        if len(state) == 0:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        grad, param, old = self._in_fp32(p, group)
        exp_avg, exp_avg_sq = self._fp32(state["exp_avg"]), self._fp32(state["exp_avg_sq"])
        state["step"] += 1
        if wd != 0:
            if group["decoupled_weight_decay"]:
                param.mul_(1 - lr * wd)
            else:
                grad = grad.add(param, alpha=wd)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = state["step"].item()
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2 ** 0.5
        if group["amsgrad"]:
            max_sq = self._fp32(state["max_exp_avg_sq"])
            torch.maximum(max_sq, exp_avg_sq, out=max_sq)
            denom = (max_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            if max_sq.data_ptr() != state["max_exp_avg_sq"].data_ptr():
                state["max_exp_avg_sq"].copy_(max_sq)
        else:
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)
        for key, value in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
            if value.data_ptr() != state[key].data_ptr():
                state[key].copy_(value)  # the state in its own dtype, rounded to nearest
        self._write_back(p, index, old, param, state)


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (default 1e-2)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, weight_update="nearest", seed=0):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, decoupled_weight_decay=True, weight_update=weight_update, seed=seed)


class SGD(_RoundedOptimizer):
    """torch.optim.SGD's update (momentum, dampening, nesterov, weight decay), computed in fp32
    and written back by `weight_update`."""

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *, maximize=False,
                 weight_update="nearest", seed=0):
        if lr < 0.0 or momentum < 0.0 or weight_decay < 0.0:
            raise ValueError("invalid lr, momentum or weight_decay (each >= 0)")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize)
        super().__init__(params, defaults, weight_update, seed)

    def _step_one(self, p, group, state, index):
        if "step" not in state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)  # the stochastic rounding's stream
        state["step"] += 1
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        grad, param, old = self._in_fp32(p, group)
        if wd != 0:
            grad = grad.add(param, alpha=wd)
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf32 = grad.detach().clone()
                state["momentum_buffer"] = buf32 if p.dtype == torch.float32 else buf32.to(p.dtype)
            else:
                buf32 = self._fp32(buf)
                buf32.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
                if buf32.data_ptr() != buf.data_ptr():
                    buf.copy_(buf32)
            grad = grad.add(buf32, alpha=momentum) if group["nesterov"] else buf32
        param.add_(grad, alpha=-lr)
        self._write_back(p, index, old, param, state)


def from_torch(optimizer, weight_update="stochastic", seed=0):
    """The optimizer you have (torch.optim.AdamW, Adam or SGD), with its param groups,
    hyper-parameters and state, as mixtrain's: the same update, computed in fp32 and written
    back by `weight_update`. The state keeps its tensors' dtypes (a bf16 model's moments stay
    bf16: 8 bytes a parameter with AdamW)."""
    _check_rule(weight_update)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError("from_torch takes a torch.optim optimizer, got %s" % type(optimizer).__name__)
    if isinstance(optimizer, _RoundedOptimizer):
        raise ValueError("the optimizer is mixtrain's already (weight_update=%r)" % optimizer.weight_update)
    groups = []
    for g in optimizer.param_groups:
        group = {k: v for k, v in g.items() if k not in ("foreach", "fused", "capturable", "differentiable")}
        groups.append(group)
    if isinstance(optimizer, torch.optim.AdamW):
        kind = AdamW
        for g in groups:
            g.pop("decoupled_weight_decay", None)
    elif isinstance(optimizer, torch.optim.Adam):
        kind = Adam
    elif isinstance(optimizer, torch.optim.SGD):
        kind = SGD
    else:
        raise ValueError("cannot convert a %s: mixtrain.optim has AdamW, Adam and SGD (torch.optim's), not yet "
                         "RMSprop or Adagrad" % type(optimizer).__name__)
    params = groups[0]["params"]
    defaults = {k: v for k, v in groups[0].items() if k not in ("params", "param_names", "initial_lr")}
    converted = kind(params, weight_update=weight_update, seed=seed, **defaults)
    converted.param_groups = []
    for g in groups:
        converted.add_param_group(dict(g))
    converted.load_state_dict(optimizer.state_dict())
    _check_params(converted.param_groups, weight_update)
    return converted
