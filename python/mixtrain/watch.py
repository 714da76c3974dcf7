"""mixtrain.watch: mixed-precision health inside your own training loop, while it trains, in
the doctor's words. One line around the loop, which is otherwise unchanged::

    with mixtrain.watch(model, opt, scaler, every=100) as w:
        for x, y in data:
            ...                                  # your loop as it is
    print(w)                                     # verdict, evidence, cure, the doctor call

What it sees, and what it costs:

- the loss scale after every ``scaler.update()``, copied on the device into a buffer that is
  read once every ``every`` steps (no host read per step); a skipped step is a step whose
  update backed the scale off;
- on each of the first 8 steps the scaler skipped (the optimizer's post-hook never ran: known
  with no read), the parameters whose gradients are not finite, flagged on the device;
- on one step in ``every`` (the sampled step): each module's largest ``|output|`` (forward hooks
  that exist only on that step) against the largest finite value of the dtype it computes in
  (fp16's 65504, under fp16 autocast for fp32 outputs too), the parameters whose gradients are
  not finite, and, for 16-bit parameters under a torch.optim optimizer, the element updates that
  round to no change: the update computed in fp32 from the optimizer's own state by mixtrain's
  optimizer core (on copies), rounded to nearest into the parameter's dtype, not a weight diff;
- under ``mixtrain.optim`` the lost-update count of every step, exact, from its update pass.

The verdict is mixtrain's one rule (C++ ``diagnose::judge_watch``, which the libtorch
``diagnose::Watch`` asks too): the thresholds and the evidence's words live there.

The watch never changes what the loop computes: the weights are bitwise those of the loop
unwatched (tested)."""
import warnings
import weakref

import torch

from . import optim as _optim

__all__ = ["watch", "Watch", "WatchReport"]


_OVERFLOW_STEPS_NOTED = 8  # diagnose::kWatchedOverflowSteps: the first overflowing steps' gradients are named

_CORE_CLASS = {"adamw": _optim.Adam, "adam": _optim.Adam, "sgd": _optim.SGD, "rmsprop": _optim.RMSprop,
               "adagrad": _optim.Adagrad}


class WatchReport:
    """What the watch concluded: ``verdict`` (the doctor's catalogue: forward_overflow,
    gradient_overflow, lost_updates or healthy), ``evidence`` (sentences with their numbers),
    ``cure`` (the lines for your loop the doctor would try first) and ``doctor_call`` (the call
    that proves a cure from where the loop stands)."""

    def __init__(self, verdict, evidence, cure, doctor_call, steps):
        self.verdict, self.evidence, self.cure, self.doctor_call, self.steps = verdict, evidence, cure, doctor_call, steps

    def to_dict(self):
        return dict(verdict=self.verdict, evidence=list(self.evidence), cure=list(self.cure),
                    doctor_call=self.doctor_call, steps=self.steps)

    def __str__(self):
        lines = ["mixtrain.watch: %s after %d step%s" % (self.verdict, self.steps, "" if self.steps == 1 else "s")]
        lines += ["  - " + e for e in self.evidence]
        if self.cure:
            lines.append("  in your loop, try:")
            lines += ["    " + c for c in self.cure]
        if self.doctor_call:
            lines.append("  to prove it from where the loop stands: " + self.doctor_call)
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self):
        import html
        return "<pre>%s</pre>" % html.escape(str(self))


class Watch:
    """See the module's doc. Made by ``mixtrain.watch(...)``; ``close()`` (or leaving the
    ``with`` block) reads what is left and removes every hook."""

    def __init__(self, model, optimizer, scaler=None, every=100):
        if not isinstance(model, torch.nn.Module):
            raise ValueError("watch takes the torch.nn.Module your loop trains, got %s" % type(model).__name__)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError("watch takes the torch.optim optimizer your loop steps, got %s" % type(optimizer).__name__)
        if scaler is not None and not (hasattr(scaler, "update") and hasattr(scaler, "get_scale")):
            raise ValueError("scaler is a %s, not a torch.amp.GradScaler" % type(scaler).__name__)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError("invalid every=%r: an integer >= 1 (one step in every N is sampled and read)" % (every,))
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError("the model has no trainable parameters: there is nothing to watch")
        for thing, what in ((model, "model"), (optimizer, "optimizer")):
            held = getattr(thing, "_mixtrain_watch", None)
            held = held() if held is not None else None
            # A deepcopy of a watched model carries the mark: only the watched object itself is refused.
            if held is not None and not held._closed and (held.model is thing or held.optimizer is thing):
                raise ValueError("this %s is watched already: close() the first watch before watching it again" % what)
        self.model, self.optimizer, self.every = model, optimizer, every
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        from . import _LOOP_OPTIMIZERS  # the doctor's names for the optimizers the core steps
        self._ours = isinstance(optimizer, _optim._RoundedOptimizer)
        self._kind = None if self._ours else _LOOP_OPTIMIZERS.get(type(optimizer))
        if self._kind == "adam" and any(g.get("decoupled_weight_decay") for g in optimizer.param_groups):
            self._kind = "adamw"
        self._names = {}
        for name, p in model.named_parameters():
            self._names.setdefault(id(p), name)
        self._steps = 0
        self._scale_buffer = None  # the block's scales, on the scaler's device
        self._scales = []  # one per step with a scaler: the scale after its update
        # The scale the watch starts from (one host read, here): a scaler not used yet starts at its init_scale.
        self._initial_scale = None
        if self.scaler is not None:
            current = getattr(self.scaler, "_scale", None)
            self._initial_scale = float(current) if current is not None else float(self.scaler._init_scale)
        self._ranges = []  # [(step, [(module, largest |output|, limit)])], sampled steps, forward order
        self._range_hooks = []
        # A TorchScript module runs its submodules without their forward hooks (and refuses
        # them): the op tracer sees its module calls instead, in C++.
        self._tracer = None
        if any(isinstance(m, torch.jit.ScriptModule) for m in model.modules()):
            from . import _native
            self._tracer = _native.ModuleRangeTracer(list(model.named_parameters()))
        self._sampled = False  # whether the running step is a sampled one
        self._pending_ranges = []  # this sampled step's, on the device
        self._nonfinite_grads = []  # [(step, [names])]
        self._pending_nonfinite = []  # [(step, names, flags on the device)], read with the block
        self._stepped = False  # the optimizer stepped since the last update (else the scaler skipped it)
        self._overflow_steps_noted = 0
        self._lost = {}  # name -> [intended, lost]
        self._lost_steps = 0
        self._ours_before = None
        self._losses = None  # [sum, count, nonfinite] on the device, from w.loss()
        self._warned = False
        self._report = None
        self._skipped, self._settling = [], 0  # the skipped steps, as the last verdict read them
        self._closed = False
        self._hooks = [optimizer.register_step_pre_hook(self._before_step),
                       optimizer.register_step_post_hook(self._after_step)]
        if self.scaler is not None:
            self._scaler_update = self.scaler.update
            self.scaler.update = self._update
        # Weak: a deepcopy of the watched model copies the mark, not the watch.
        model._mixtrain_watch = weakref.ref(self)
        optimizer._mixtrain_watch = weakref.ref(self)
        self._sample()  # the first step is sampled

    # ---- the loop's events

    def loss(self, loss):
        """Optional: hand the watch each step's loss (kept on the device, read with the rest)."""
        if not isinstance(loss, torch.Tensor):
            raise ValueError("w.loss takes the loss tensor, got %s" % type(loss).__name__)
        v = loss.detach().float().reshape(-1)[:1].sum()
        if self._losses is None:
            self._losses = torch.zeros(3, device=v.device)
        self._losses += torch.stack([torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0), torch.ones_like(v),
                                     (~torch.isfinite(v)).float()])
        return loss

    def _before_step(self, optimizer, args, kwargs):
        if self._ours:
            self._ours_before = {i: tuple(c) for i, c in optimizer._lost.items()}
        elif self._sampled and self._kind is not None:
            self._count_lost_updates()

    def _after_step(self, optimizer, args, kwargs):
        self._stepped = True
        if self._ours and self._ours_before is not None:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    i = optimizer._index(p)
                    now = optimizer._lost.get(i)
                    if now is None or p.dtype not in (torch.bfloat16, torch.float16):
                        continue
                    before = self._ours_before.get(i, (0, 0))
                    if now[0] < before[0]:
                        before = (0, 0)  # the loop read lost_updates() in between (it restarts the count)
                    c = self._lost.setdefault(self._names.get(id(p), str(i)), [0, 0])
                    c[0] += now[0] - before[0]
                    c[1] += now[1] - before[1]
            self._lost_steps += 1
            self._ours_before = None
        if self.scaler is None:
            self._end_step()

    def _update(self, new_scale=None):
        # A step the scaler skipped never reached the optimizer's post-hook: known with no read.
        skipped, self._stepped = not self._stepped, False
        if self._sampled or (skipped and self._overflow_steps_noted < _OVERFLOW_STEPS_NOTED):
            self._overflow_steps_noted += skipped
            self._note_nonfinite_grads()
        self._scaler_update(new_scale)
        scale = getattr(self.scaler, "_scale", None)
        if scale is not None:
            if self._scale_buffer is None:
                self._scale_buffer = torch.empty(self.every, dtype=torch.float32, device=scale.device)
            self._scale_buffer[self._steps % self.every].copy_(scale.reshape(()))
        self._end_step()

    def _end_step(self):
        if self._sampled:
            self._unsample()
            if self.scaler is None:
                self._note_nonfinite_grads()
        self._steps += 1
        if self._steps % self.every == 0:
            self._read()
            self._sample()

    # ---- sampled steps

    def _sample(self):
        self._sampled = True
        if self._tracer is not None:
            self._tracer.start()
            return

        def hook_for(name):
            def hook(module, inputs, output):
                t = _first_floating(output)
                if t is None:
                    return
                limit = _limit(t)
                if limit is not None:
                    self._pending_ranges.append((name, t.detach().abs().amax().float(), limit))
            return hook
        for name, module in self.model.named_modules():
            if name:
                self._range_hooks.append(module.register_forward_hook(hook_for(name)))

    def _unsample(self):
        self._sampled = False
        if self._tracer is not None and self._tracer.running():
            self._pending_ranges = list(self._tracer.stop())
        for h in self._range_hooks:
            h.remove()
        self._range_hooks = []
        if self._pending_ranges:
            self._ranges.append((self._steps, self._pending_ranges))
        self._pending_ranges = []

    def _note_nonfinite_grads(self):
        named = [(n, p) for n, p in self.model.named_parameters() if p.grad is not None]
        if named:
            flags = torch.stack([(~torch.isfinite(p.grad)).any() for _, p in named])
            self._pending_nonfinite.append((self._steps, [n for n, _ in named], flags))

    def _count_lost_updates(self):
        """This step's torch.optim update, computed in fp32 from the optimizer's own state by
        mixtrain's core on copies, rounded to nearest: the element updates that leave their
        16-bit weight unchanged."""
        from . import _native
        core = _CORE_CLASS[self._kind]
        for group in self.optimizer.param_groups:
            hyper = _optim._hyper(group)
            for p in group["params"]:
                if p.grad is None or p.dtype not in (torch.bfloat16, torch.float16) or p.grad.is_sparse:
                    continue
                state = {k: v.detach().clone() for k, v in self.optimizer.state.get(p, {}).items()
                         if isinstance(v, torch.Tensor) and v.dim() > 0}
                if self._kind == "adagrad" and "sum" not in state:
                    continue
                step = int(float(self.optimizer.state.get(p, {}).get("step", 0))) + 1
                tensors, fresh = core._state_of(None, p, group, state)
                counts = _native.update_parameter(self._kind, p.detach().clone(), p.grad, tensors, hyper, step, fresh,
                                                  "nearest", None, 0, 0)
                c = self._lost.setdefault(self._names.get(id(p), "?"), [0, 0])
                c[0] += counts["intended"]
                c[1] += counts["lost"]
        self._lost_steps += 1

    # ---- reading and judging

    def _read(self):
        """The one host read of a block of steps: the scales, the sampled ranges and flags."""
        n = self._steps - len(self._scales) if self.scaler is not None else 0
        if self._scale_buffer is not None and n > 0:
            at = len(self._scales) % self.every  # the buffer holds a block, by step % every; reads end at block ends
            self._scales += self._scale_buffer[at:at + n].tolist()
        for i, (step, ranges) in enumerate(self._ranges):
            if ranges and isinstance(ranges[0][1], torch.Tensor):
                values = torch.stack([r[1] for r in ranges]).tolist()
                self._ranges[i] = (step, [(r[0], v, r[2]) for r, v in zip(ranges, values)])
        if self._pending_nonfinite:
            flags = torch.cat([f for _, _, f in self._pending_nonfinite]).tolist()  # one read for the block
            for step, names, _ in self._pending_nonfinite:
                bad = [n for n, f in zip(names, flags[:len(names)]) if f]
                flags = flags[len(names):]
                if bad:
                    self._nonfinite_grads.append((step, bad))
            self._pending_nonfinite = []
        self._report = self._judge()
        if self._report.verdict != "healthy" and not self._warned:
            self._warned = True
            from . import MixtrainWarning
            message = "mixtrain.watch: %s: %s" % (self._report.verdict, self._report.evidence[0])
            if self._report.cure:
                message += "; try: " + self._report.cure[0]
            warnings.warn(message, MixtrainWarning, stacklevel=2)

    def _judge(self):
        """The verdict by mixtrain's one rule (diagnose::judge_watch, which the C++ Watch asks
        too), over what the watch has read; the cure in this loop's lines."""
        from . import _loop_lines, _native
        ranges = [(step, [(n, v, limit) for n, v, limit in r]) for step, r in self._ranges
                  if not r or isinstance(r[0][1], float)]
        counted = ""
        if self._lost:
            counted = ("every step, exact, from mixtrain.optim's update pass" if self._ours else
                       "on %d sampled step%s: the update computed in fp32 from the optimizer's own state, rounded "
                       "to nearest into the weight's dtype" % (self._lost_steps, "" if self._lost_steps == 1 else "s"))
        judged = _native.judge_watch(self._steps, self.every, self._initial_scale, self._scales, ranges,
                                     self._nonfinite_grads, [(n, c[0], c[1]) for n, c in self._lost.items()],
                                     self.optimizer.weight_update if self._ours else "nearest", counted)
        self._skipped, self._settling = judged["skipped_steps"], judged["settling"]
        cure = [line for setting in judged["cure"] for line in (_loop_lines([setting], ours=self._ours) or [])]
        call = None
        if judged["verdict"] != "healthy":
            call = "mixtrain.doctor(model, data, optimizer=opt%s, steps=%d)" % (
                ", scaler=scaler" if self.scaler is not None else "", judged["doctor_steps"])
        return WatchReport(judged["verdict"], judged["evidence"], cure, call, self._steps)

    # ---- what the user reads

    def report(self):
        """The verdict so far (reads what the last block left on the device)."""
        if not self._closed and (self._steps % self.every != 0 or self._report is None):
            self._read()
        return self._report

    def to_dict(self):
        """The raw series: the scale after each step, the skipped steps, each sampled step's
        module ranges, the non-finite gradients seen, and the lost-update counts per parameter."""
        report = self.report()
        out = dict(steps=self._steps, every=self.every, verdict=report.verdict, scales=list(self._scales),
                   initial_scale=self._initial_scale, skipped_steps=list(self._skipped), settling_skips=self._settling,
                   module_ranges=[dict(step=s, ranges={n: v for n, v, _ in r}) for s, r in self._ranges
                                  if not r or isinstance(r[0][1], float)],
                   nonfinite_gradients=[dict(step=s, params=n) for s, n in self._nonfinite_grads],
                   lost_updates=dict(per_param={n: dict(intended=c[0], lost=c[1]) for n, c in self._lost.items()},
                                     counted_steps=self._lost_steps, exact=self._ours))
        if self._losses is not None:
            total, count, bad = self._losses.tolist()
            out["losses"] = dict(count=int(count), mean_of_finite=total / max(count - bad, 1), nonfinite=int(bad))
        return out

    def plot(self):
        """The loss-scale history the doctor draws (the scale after each step, the skipped steps
        marked), as SVG text that a notebook shows; None without a GradScaler."""
        self.report()
        if not self._scales:
            return None
        from . import _native
        skipped = set(self._skipped)
        return _Svg(_native.scale_history_svg(list(self._scales), [i in skipped for i in range(len(self._scales))],
                                              "fp16, watched"))

    def close(self):
        """Reads what is left and removes every hook (the optimizer's, the scaler's, the modules')."""
        if self._closed:
            return
        self._unsample_without_keeping()
        self._read()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.scaler is not None:
            del self.scaler.update  # the instance attribute: the class's method again
        for thing in (self.model, self.optimizer):
            held = getattr(thing, "_mixtrain_watch", None)
            if held is not None and held() is self:
                del thing._mixtrain_watch
        self._closed = True

    def _unsample_without_keeping(self):
        self._sampled = False
        if self._tracer is not None:
            self._tracer.stop()
        for h in self._range_hooks:
            h.remove()
        self._range_hooks = []
        self._pending_ranges = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __str__(self):
        return str(self.report())

    __repr__ = __str__

    def _repr_html_(self):
        return self.report()._repr_html_()


class _Svg(str):
    """SVG text that a notebook renders as the chart."""

    def _repr_svg_(self):
        return str(self)


def _first_floating(value):
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() and value.numel() > 0 else None
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_floating(v)
            if t is not None:
                return t
    if isinstance(value, dict):
        for v in value.values():
            t = _first_floating(v)
            if t is not None:
                return t
    return None


def _limit(t):
    """The largest finite value of the dtype `t` is computed in: its own for fp16/bf16; fp16's
    for an fp32 output under fp16 autocast (the next op casts it)."""
    if t.dtype in (torch.float16, torch.bfloat16):
        return float(torch.finfo(t.dtype).max)
    if t.dtype == torch.float32:
        device = t.device.type
        try:
            if torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.float16:
                return float(torch.finfo(torch.float16).max)
        except (TypeError, RuntimeError):
            return None
    return None


def watch(model, optimizer, scaler=None, every=100):
    """Watch a training loop's mixed-precision health while it trains (see mixtrain.watch's
    module doc). Use as ``with mixtrain.watch(model, opt, scaler) as w:`` around the loop, or
    ``w = mixtrain.watch(...)`` ... ``w.close()``. ``every``: one step in every N is sampled
    (module ranges, non-finite gradients, a torch.optim optimizer's lost updates) and the
    device's records are read once per N steps. Warns once (MixtrainWarning) when a verdict's
    rule is met; ``print(w)`` / ``w.report()`` give the verdict, evidence, cure and the doctor
    call; ``w.to_dict()`` the raw series."""
    return Watch(model, optimizer, scaler=scaler, every=every)
