"""fp32 islands for any model, in your own loop: the modules named keep their parameters and
buffers in fp32 and run their forward in fp32, inside torch.autocast and inside a bf16 model
alike (inputs cast to fp32 on the way in, outputs back to the input's dtype on the way out),
as Hugging Face's ``_keep_in_fp32_modules`` leaves a model. The doctor proves an island
(``keep_fp32=["head"]``); this is the line that applies it where you train::

    islands = mixtrain.keep_fp32(model, ["blocks.0.ln1", "head"])
    ...                                   # train as before
    islands.remove()                      # undo: dtypes and forwards as they were
"""
import fnmatch

import torch

__all__ = ["keep_fp32", "Fp32Islands"]


def _floating(t):
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _map(fn, value):
    """`fn` on every tensor in (nested) tuples, lists and dicts; the rest as it is."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_map(fn, v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map(fn, v) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _map(fn, v)) for k, v in value.items())
    return value


def _first_floating_dtype(value):
    found = []
    _map(lambda t: found.append(t.dtype) if _floating(t) else None, value)
    return found[0] if found else None


class HeldInFp32:
    """The floating parameters and buffers of `modules` that are not fp32, held in fp32
    storage until restore() gives each its own dtype back (a tied parameter once). What an
    island does to its module, and what mixtrain's runs do to a bf16 model while they hold
    it: model.float() and model.to(bf16) would lose which tensor was which dtype."""

    def __init__(self, modules):
        self._params, self._buffers, seen = [], [], set()
        for module in modules:
            for p in module.parameters():
                if p.is_floating_point() and p.dtype != torch.float32 and id(p) not in seen:
                    seen.add(id(p))
                    self._params.append((p, p.dtype))
            for m in module.modules():
                for name, b in m._buffers.items():
                    if b is not None and b.is_floating_point() and b.dtype != torch.float32:
                        self._buffers.append((m, name, b.dtype))
        with torch.no_grad():
            for p, _ in self._params:
                p.data = p.data.float()
            for m, name, _ in self._buffers:
                m._buffers[name] = m._buffers[name].float()

    def restore(self, parameters=True):
        """Each buffer, and unless told otherwise each parameter, back to its own dtype."""
        with torch.no_grad():
            if parameters:
                for p, dtype in self._params:
                    p.data = p.data.to(dtype)
            for m, name, dtype in self._buffers:
                m._buffers[name] = m._buffers[name].to(dtype)


class Fp32Islands:
    """What keep_fp32 changed, and `remove()` to undo it (also a context manager)."""

    def __init__(self, model, names):
        self.names = list(names)
        self._modules = [model.get_submodule(n) for n in self.names]
        self._held = HeldInFp32(self._modules)
        for module in self._modules:
            module.forward = self._in_fp32(module.forward)
        self._removed = False

    @staticmethod
    def _in_fp32(forward):
        def run_in_fp32(*args, **kwargs):
            back = _first_floating_dtype((args, kwargs))
            to32 = lambda t: t.float() if _floating(t) else t  # noqa: E731
            args, kwargs = _map(to32, args), _map(to32, kwargs)
            # Autocast off for the module's own ops, on the CPU and on CUDA: an island computes in fp32.
            with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
                out = forward(*args, **kwargs)
            if back is None or back == torch.float32:
                return out  # fp32 in (autocast's own inputs): fp32 out, as autocast would give the next op
            return _map(lambda t: t.to(back) if _floating(t) else t, out)
        run_in_fp32.__wrapped__ = forward
        return run_in_fp32

    def remove(self):
        """Every parameter and buffer back to its own dtype, every forward back to its own."""
        if self._removed:
            return
        self._held.restore()
        for module in self._modules:
            if "forward" in module.__dict__:
                del module.forward
        self._removed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()

    def __repr__(self):
        return "<mixtrain.Fp32Islands %s%s>" % (", ".join(self.names), " (removed)" if self._removed else "")


def keep_fp32(model, names):
    """Keep the modules `names` of `model` in fp32 (parameters, buffers and forward), in a bf16
    model and under torch.autocast alike; returns a handle whose remove() undoes it.

    `names` are module paths as ``model.named_modules()`` gives them (``"blocks.0.ln1"``), or
    patterns with ``*`` for one component (``"blocks.*.ln1"``); a string is one name. An unknown
    name is a ValueError that lists the model's module names."""
    if not isinstance(model, torch.nn.Module) or isinstance(model, torch.jit.ScriptModule):
        raise ValueError("keep_fp32 takes an eager torch.nn.Module, not %s" % type(model).__name__)
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, tuple)) or not names:
        raise ValueError("keep_fp32 takes module names (a name, or a list of them), got %r" % (names,))
    known = [n for n, _ in model.named_modules() if n]
    chosen = []
    for pattern in names:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("keep_fp32: %r is not a module name" % (pattern,))
        parts = pattern.split(".")
        matched = [n for n in known if len(n.split(".")) == len(parts) and
                   all(p == "*" or fnmatch.fnmatchcase(c, p) for c, p in zip(n.split("."), parts))]
        if not matched:
            shown = ", ".join(known[:40]) + (", ... (%d in all)" % len(known) if len(known) > 40 else "")
            raise ValueError("keep_fp32: the model has no module %r; its modules: %s" % (pattern, shown))
        chosen += [n for n in matched if n not in chosen]
    # A module inside another island is already kept.
    outer = [n for n in chosen if not any(n != o and n.startswith(o + ".") for o in chosen)]
    if any(getattr(model.get_submodule(n), "forward", None) is not None and
           "forward" in model.get_submodule(n).__dict__ for n in outer):
        raise ValueError("keep_fp32: %s is already kept in fp32 (or its forward replaced): remove() the first "
                         "handle before keeping it again" % ", ".join(outer))
    return Fp32Islands(model, outer)
