"""mixtrain's optimizers for your own loop: AdamW, Adam, SGD, RMSprop and Adagrad over parameters (and their
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
(a ``torch.optim.AdamW``'s state loads into ``mixtrain.optim.AdamW`` and back). In fp32 each
step is torch's single-tensor implementation (the one torch runs on the CPU) with a correctly
rounded square root, bitwise: torch's CPU root is MKL's, an ulp off in about 17% of elements on
AVX-512 CPUs (correct on AVX2 ones), which leaves a weight within 4 ulps of torch's own step (of
the larger of the weight and its update). ``opt.lost_updates()`` counts the element updates
that rounded to no change.

The step runs in C++ (the optimizer core the C++ optimizers share, mixtrain/optim/): Adam and
AdamW on contiguous CPU tensors in one fused pass that reads and writes each tensor once; the
others a chunk at a time, so the optimizer holds no fp32 copy of the model.
"""
import torch

from . import _native

__all__ = ["AdamW", "Adam", "SGD", "RMSprop", "Adagrad", "from_torch", "cpu_pass_vectorized", "WEIGHT_UPDATES"]

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


def _hyper(group):
    """A param group's hyper-parameters as the core reads them: numbers (torch allows a tensor lr)."""
    return {k: (v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v)
            for k, v in group.items() if k not in ("params", "param_names")}


_STREAM_PRIME = 0x100000001B3  # amp::stochastic_stream: one stream per parameter and step
_U64 = (1 << 64) - 1


class _RoundedOptimizer(torch.optim.Optimizer):
    """The shared part: each parameter's step goes through the C++ optimizer core
    (mixtrain/optim/update_rule.h, the one the C++ optimizers use): computed in fp32 on the
    parameter, gradient and state as stored (fp32 tensors in place; 16-bit ones a chunk at a
    time), and written back once: the parameter by the rule, its state to nearest, the lost
    element updates counted."""

    _kind = None  # the core's name for the update: "sgd", "rmsprop", "adagrad" (Adam's depends on the group)

    def __init__(self, params, defaults, weight_update, seed):
        _check_rule(weight_update)
        self.weight_update = weight_update
        self.seed = int(seed)
        params = list(params)
        # A group's params may be a generator (model.fc.parameters()): read it once, here, so
        # that the check below and torch's constructor see the same tensors.
        params = [dict(g, params=[g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"]))
                  if isinstance(g, dict) and "params" in g else g for g in params]
        # Said in our words before torch's own check ("can't optimize a non-leaf Tensor").
        _check_params([g if isinstance(g, dict) else {"params": [g]} for g in params], weight_update)
        super().__init__(params, defaults)
        _check_params(self.param_groups, weight_update)
        self._lost = {}  # parameter index -> [intended, lost] since the last lost_updates()

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
        return self._param_indices()[id(p)]

    def _param_indices(self):
        """Each parameter's place in the optimizer's order, by id (rebuilt when a group is added)."""
        if not hasattr(self, "_indices") or len(self._indices) != sum(len(g["params"]) for g in self.param_groups):
            self._indices = {id(q): i for i, q in enumerate(q for g in self.param_groups for q in g["params"])}
        return self._indices

    def _kind_of(self, group):
        return self._kind

    def _state_of(self, p, group, state):
        """The state tensors the core reads, in its order (created in p's dtype where missing),
        and whether SGD's momentum buffer is fresh (it then takes the gradient as it is)."""
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        indices = self._param_indices()  # once a step, not once a parameter
        for group in self.param_groups:
            kind = self._kind_of(group)
            # The group's parameters in one native call: one pass over them all.
            params, grads, states, steps, fresh_flags, comps, streams, where = [], [], [], [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("mixtrain's optimizers take dense gradients")
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                tensors, fresh = self._state_of(p, group, state)
                state["step"] += 1
                step = int(state["step"].item())
                comp = None
                if self.weight_update == "kahan" and p.dtype == torch.bfloat16:
                    comp = state.get("kahan_comp")
                    if comp is None:
                        comp = state["kahan_comp"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                index = indices[id(p)]
                params.append(p)
                grads.append(p.grad)
                states.append(tensors)
                steps.append(step)
                fresh_flags.append(fresh)
                comps.append(comp)
                streams.append((step * _STREAM_PRIME + index) & _U64)
                where.append(index)
            if not params:
                continue
            counts = _native.update_parameters(kind, params, grads, states, _hyper(group), steps, fresh_flags,
                                               self.weight_update, comps, self.seed, streams)
            for index, c in zip(where, counts):
                lost = self._lost.setdefault(index, [0, 0])
                lost[0] += c["intended"]
                lost[1] += c["lost"]
        return loss


def _zeros(p):
    return torch.zeros_like(p, memory_format=torch.preserve_format)


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

    def _kind_of(self, group):
        return "adamw" if group["decoupled_weight_decay"] else "adam"  # decoupled weight decay is AdamW's update

    def _state_of(self, p, group, state):
        for key in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ()):
            if key not in state:
                state[key] = _zeros(p)
        return [state["exp_avg"], state["exp_avg_sq"]] + ([state["max_exp_avg_sq"]] if group["amsgrad"] else []), False


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (default 1e-2)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, weight_update="nearest", seed=0):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, decoupled_weight_decay=True, weight_update=weight_update, seed=seed)


class SGD(_RoundedOptimizer):
    """torch.optim.SGD's update (momentum, dampening, nesterov, weight decay), computed in fp32
    and written back by `weight_update`."""

    _kind = "sgd"

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *, maximize=False,
                 weight_update="nearest", seed=0):
        if lr < 0.0 or momentum < 0.0 or weight_decay < 0.0:
            raise ValueError("invalid lr, momentum or weight_decay (each >= 0)")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize)
        super().__init__(params, defaults, weight_update, seed)

    def _state_of(self, p, group, state):
        if group["momentum"] == 0:
            return [], False
        fresh = state.get("momentum_buffer") is None
        if fresh:
            state["momentum_buffer"] = _zeros(p)
        return [state["momentum_buffer"]], fresh


class RMSprop(_RoundedOptimizer):
    """torch.optim.RMSprop's update (alpha, momentum, centered, weight decay), computed in fp32
    and written back by `weight_update`."""

    _kind = "rmsprop"

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False, *,
                 maximize=False, weight_update="nearest", seed=0):
        if lr < 0.0 or eps < 0.0 or momentum < 0.0 or weight_decay < 0.0 or alpha < 0.0:
            raise ValueError("invalid lr, eps, momentum, weight_decay or alpha (each >= 0)")
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered,
                        maximize=maximize)
        super().__init__(params, defaults, weight_update, seed)

    def _state_of(self, p, group, state):
        keys = ["square_avg"] + (["momentum_buffer"] if group["momentum"] > 0 else []) + \
            (["grad_avg"] if group["centered"] else [])
        for key in keys:
            if key not in state:
                state[key] = _zeros(p)
        return [state[k] for k in keys], False


class Adagrad(_RoundedOptimizer):
    """torch.optim.Adagrad's update (lr_decay, initial_accumulator_value, weight decay),
    computed in fp32 and written back by `weight_update`. Its state is made when it is built,
    as torch's is."""

    _kind = "adagrad"

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10, *,
                 maximize=False, weight_update="nearest", seed=0):
        if lr < 0.0 or lr_decay < 0.0 or weight_decay < 0.0 or initial_accumulator_value < 0.0 or eps < 0.0:
            raise ValueError("invalid lr, lr_decay, weight_decay, initial_accumulator_value or eps (each >= 0)")
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, maximize=maximize)
        super().__init__(params, defaults, weight_update, seed)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["sum"] = torch.full_like(p, group["initial_accumulator_value"],
                                               memory_format=torch.preserve_format)

    def _state_of(self, p, group, state):
        if "sum" not in state:
            state["sum"] = torch.full_like(p, group["initial_accumulator_value"], memory_format=torch.preserve_format)
        return [state["sum"]], False


def from_torch(optimizer, weight_update="stochastic", seed=0):
    """The optimizer you have (torch.optim.AdamW, Adam, SGD, RMSprop or Adagrad), with its param groups,
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
    elif isinstance(optimizer, torch.optim.RMSprop):
        kind = RMSprop
    elif isinstance(optimizer, torch.optim.Adagrad):
        kind = Adagrad
    else:
        raise ValueError("cannot convert a %s: mixtrain.optim converts torch.optim's AdamW, Adam, SGD, RMSprop and "
                         "Adagrad" % type(optimizer).__name__)
    params = groups[0]["params"]
    defaults = {k: v for k, v in groups[0].items() if k not in ("params", "param_names", "initial_lr")}
    converted = kind(params, weight_update=weight_update, seed=seed, **defaults)
    converted.param_groups = []
    for g in groups:
        converted.add_param_group(dict(g))
    converted.load_state_dict(optimizer.state_dict())
    _check_params(converted.param_groups, weight_update)
    return converted


def cpu_pass_vectorized():
    """Whether the step's CPU passes (the fused Adam pass, its square root, the bf16 stores) run
    their AVX2+FMA loops in this process now: the CPU has them and ``MIXTRAIN_CPU_AVX2`` is not
    ``"0"``. Otherwise they run the same arithmetic one element at a time, to the same bits, so
    this changes no result: it says which code a benchmark or a report measured."""
    return _native.cpu_pass_vectorized()
