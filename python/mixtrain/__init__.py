"""mixtrain from Python: the doctor, lr_find and mixed-precision training for a
PyTorch model object and tensors, with no files written unless ``out`` is given.

In a notebook::

    import mixtrain
    d = mixtrain.doctor(model, (x, y))   # an nn.Module (or ScriptModule) and its data
    d                                    # the verdict, the fixes and the loss chart
    d.proven_fix                         # the fix the doctor tried and saw work
    r = mixtrain.train(model, (x, y), precision="fp16", epochs=3)

In your own loop, the doctor's cures are lines::

    d = mixtrain.doctor(model, batches, optimizer=opt, steps=40)   # from where the loop stands
    d.loop_lines                                                   # the proven fix, to paste
    opt = mixtrain.optim.from_torch(opt, weight_update="stochastic")
    islands = mixtrain.keep_fp32(model, ["head"])

The keyword arguments are the ``mixtrain`` CLI's options (the run layer's option
table): the same names with underscores, the same defaults and checks. A bad
value is a ValueError with the CLI's one-line message; Ctrl-C raises
KeyboardInterrupt after the batch in flight.

The C++ library underneath is the one the CLI runs: ``_native`` hands the model's
TorchScript form and the tensors to it without copying them.
"""
import inspect
import json
import numbers
import os
import shutil
import tempfile
import warnings

import torch  # registers TorchScript's types before the extension uses them


def _check_torch():
    """The torch this Python imports must be the one _native was built against: another
    minor version breaks its symbols, another C++ ABI its strings, another CUDA build
    its kernels. Said in one line, before loading _native fails less clearly."""
    try:
        from . import _build_info as built
    except ImportError:
        # The source folder (python/mixtrain) holds no build: its _build_info and _native are
        # written by the build. Said so, not as a circular import.
        raise ImportError("this mixtrain is the source folder %s, which holds no build: import the built package "
                          "(pip install ., or PYTHONPATH=BUILD_DIR/python after make)" % os.path.dirname(__file__)) from None
    import sys
    now = (torch.__version__.split("+")[0], bool(torch._C._GLIBCXX_USE_CXX11_ABI), torch.version.cuda or None)
    then = (built.TORCH_VERSION, built.CXX11_ABI, built.CUDA)
    if now != then:
        def say(v):
            return "torch %s (C++11 ABI %s, %s)" % (v[0], "on" if v[1] else "off", "CUDA " + v[2] if v[2] else "CPU")
        raise ImportError("mixtrain was built against %s, but this Python imports %s: rebuild it against this torch "
                          "(%s)" % (say(then), say(now), built.REBUILD.replace("{python}", sys.executable)))


_check_torch()
from . import _native  # noqa: E402 (after the check)
from . import _build_info as _built  # noqa: E402

# As the wheel names itself: 0.2.0+torch2.13.0.cpu (python/build_support/torch_pin.py).
__version__ = "%s+torch%s.%s" % (_built.VERSION, _built.TORCH_VERSION,
                                 "cu" + _built.CUDA.replace(".", "") if _built.CUDA else "cpu")

from .fp32_islands import Fp32Islands, HeldInFp32, keep_fp32  # noqa: E402
from . import optim  # noqa: E402

__all__ = ["doctor", "train", "lr_find", "keep_fp32", "Fp32Islands", "optim", "watch", "Watch", "WatchReport",
           "Diagnosis", "Result", "LrFind", "MixtrainWarning"]


class MixtrainWarning(RuntimeWarning):
    """What a run warns of: a fit that skipped many steps or lost most bf16 updates, NaN
    inputs, a run stopped on a NaN loss. Filter or catch it as any warning
    (``warnings.simplefilter("error", mixtrain.MixtrainWarning)``)."""


def _say_warnings(native, stacklevel):
    """The run's warnings, in Python's words, through warnings.warn (after the run)."""
    for line in native.get("warnings", []):
        warnings.warn(line, MixtrainWarning, stacklevel=stacklevel + 1)

def _rows(command):
    """The keyword arguments of `command`: the option table's rows that are keywords
    (the model, data and out are arguments; the CLI's own runs keep the rest)."""
    return _native.options(command)


def _default(row):
    """The table's default text as the Python value a caller would pass."""
    text, kind = row["default"], row["type"]
    if kind == "switch":
        return text == "true"
    if text == "":
        return None
    if kind == "int":
        return int(text)
    if kind in ("number", "lrs"):
        try:
            return float(text)
        except ValueError:
            return text
    if kind == "list":
        return text.split(",")
    return text


def _is_number(v):
    # numbers.Real holds numpy's scalars (np.float32, np.int64) as well as int and float.
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _is_integer(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _text(row, value):
    """A keyword argument's value as the table's text; None leaves the default."""
    key, kind = row["key"], row["type"]
    if value is None:
        return None
    # numpy 2 writes its scalars' repr as np.float64(32.5): the value is shown as Python's.
    shown = value.item() if isinstance(value, numbers.Number) and hasattr(value, "item") else value
    bad = ValueError("invalid %s=%r: %s" % (key, shown, {
        "switch": "True or False", "int": "an integer", "number": "a number", "text": "a string",
        "lrs": "a number, a list of numbers (one per parameter group) or slice(lo, hi)",
        "list": "a name or a list of names"}[kind]))
    if kind == "switch":
        if not isinstance(value, bool):
            raise bad
        return "true" if value else "false"
    if kind == "int":
        if not _is_integer(value):
            raise bad
        return str(int(value))
    if kind == "number":
        if not _is_number(value):
            raise bad
        return repr(float(value))
    if kind == "lrs":
        if _is_number(value):
            return repr(float(value))
        if isinstance(value, slice) and value.step is None and _is_number(value.stop) and (
                value.start is None or _is_number(value.start)):
            return ("" if value.start is None else repr(float(value.start))) + ":" + repr(float(value.stop))
        if isinstance(value, (list, tuple)) and value and all(_is_number(v) for v in value):
            return ",".join(repr(float(v)) for v in value)
        if isinstance(value, str):
            return value
        raise bad
    if kind == "list":
        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return ",".join(value)
        raise bad
    if key == "split_at" and not isinstance(value, str):
        # Parameter-name prefixes: a list of them (["4", "8"], [4, 8] for a Sequential's layers).
        parts = value if isinstance(value, (list, tuple)) else [value]
        if not parts or not all(isinstance(v, str) or _is_integer(v) for v in parts):
            raise ValueError("invalid split_at=%r: a name, or a list of names (parameter-name prefixes such as "
                             "'head' or 4)" % (value,))
        return ",".join(str(v) for v in parts)
    if not isinstance(value, str):
        raise bad
    return value


def _as_tensor(v):
    """A tensor, or a numpy array (anything with __array__) as one; else None."""
    if isinstance(v, torch.Tensor):
        return v
    if hasattr(v, "__array__") and not isinstance(v, (str, bytes)):
        return torch.as_tensor(v.__array__())
    return None


def _pair(data):
    """(x, y) as tensors when `data` is one: x a tensor/array or a list/tuple of them."""
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        return None
    x, y = data
    xs = [x] if _as_tensor(x) is not None else list(x) if isinstance(x, (list, tuple)) else None
    if not xs or any(_as_tensor(t) is None for t in xs) or _as_tensor(y) is None:
        return None
    return [_as_tensor(t) for t in xs], _as_tensor(y)


def _tensors(data, what):
    """(x, y) with x a tensor or a list/tuple of tensors: the model's inputs, the targets."""
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError("%s must be (x, y) (x a tensor or a list of tensors, y the targets; numpy arrays too), a "
                         "map-style Dataset of (x, y) samples, or an iterable of (x, y) batches such as a DataLoader; "
                         "got %s" % (what, type(data).__name__))
    x, y = data
    xs = [x] if _as_tensor(x) is not None else list(x) if isinstance(x, (list, tuple)) else None
    if not xs:
        raise ValueError("%s: x is a %s, not a tensor or a list of tensors" % (what, type(x).__name__))
    for i, t in enumerate(xs):
        if _as_tensor(t) is None:
            raise ValueError("%s: x[%d] is a %s, not a tensor" % (what, i, type(t).__name__))
    if _as_tensor(y) is None:
        raise ValueError("%s: y is a %s, not a tensor" % (what, type(y).__name__))
    tensors = [_as_tensor(t) for t in xs] + [_as_tensor(y)]
    for name, t in zip(["x[%d]" % i for i in range(len(xs))] + ["y"], tensors):
        if t.is_meta:
            raise ValueError("%s: %s is on the meta device (it holds no values): pass real tensors" % (what, name))
        if t.layout != torch.strided:
            raise ValueError("%s: %s is a %s tensor: pass %s.to_dense()" % (what, name, str(t.layout).replace("torch.", ""), name))
    if len(tensors[-1]) == 0:
        raise ValueError("%s holds no samples" % what)
    return [t.detach().cpu() for t in tensors[:-1]], tensors[-1].detach().cpu()


def _stacked(samples, what):
    """Samples or batches [(x, y), ...] as one (xs, y): samples stacked, batches concatenated."""
    pairs = []
    for i, item in enumerate(samples):
        pair = _pair(item) if isinstance(item, (tuple, list)) else None
        if pair is None and isinstance(item, (tuple, list)) and len(item) == 2:
            x, y = item  # a Dataset item: y may be a Python number
            xs = [x] if _as_tensor(x) is not None else list(x) if isinstance(x, (list, tuple)) else None
            if xs and all(_as_tensor(t) is not None for t in xs) and _is_number(y):
                pair = ([_as_tensor(t) for t in xs], torch.tensor(y))
        if pair is None:
            raise ValueError("%s: item %d is a %s, not an (x, y) pair of tensors" % (what, i, type(item).__name__))
        pairs.append(pair)
    if not pairs:
        raise ValueError("%s holds no samples" % what)
    n_inputs = len(pairs[0][0])
    if any(len(p[0]) != n_inputs for p in pairs):
        raise ValueError("%s: its items hold different numbers of inputs" % what)
    join = torch.stack if pairs[0][1].dim() == 0 else torch.cat  # samples, or batches
    try:
        xs = [join([p[0][k].detach().cpu() for p in pairs]) for k in range(n_inputs)]
        y = join([p[1].detach().cpu() for p in pairs])
    except RuntimeError as e:
        raise ValueError("%s: its items do not stack into one tensor (%s)" % (what, str(e).splitlines()[0]))
    return xs, y


def _samples_in(item):
    """How many samples an (x, y) item holds: a batch's y is 1-d or more, a sample's a
    0-d tensor or a number (a list of (x_i, y_i) samples is a dataset too)."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        y = _as_tensor(item[1])
        if y is not None and y.dim() > 0:
            return len(y)
    return 1


def _drawn(data, what, max_samples, seed):
    """(xs, y) from what the user holds: (x, y) tensors or numpy arrays, a map-style
    Dataset (at most max_samples drawn once, in an order seeded by `seed`), or an
    iterable of (x, y) batches such as a DataLoader (its first batches, up to
    max_samples, iterated under `seed`). The doctor's two runs then see the same
    samples in the same order: they are drawn here, once."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and _as_tensor(data[1]) is not None:
        return _tensors(data, what)  # (x, y): its own checks name what is wrong in it
    from torch.utils.data import Dataset, IterableDataset
    if max_samples is None or not _is_integer(max_samples) or max_samples < 1:
        raise ValueError("invalid max_samples=%r: an integer >= 1" % (max_samples,))
    is_map = isinstance(data, Dataset) and not isinstance(data, IterableDataset) and hasattr(data, "__len__")
    if is_map:
        n = len(data)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max_samples].tolist()
        xs, y = _stacked((data[i] for i in order), what)
        print("mixtrain: notice: %s: %d of the Dataset's %d samples, drawn once in an order seeded by seed=%d%s" % (
            what, len(y), n, seed, " (max_samples=%d)" % max_samples if n > max_samples else ""))
        return xs, y
    if hasattr(data, "__iter__") and not isinstance(data, (str, bytes, dict, torch.Tensor)):
        batches, count = [], 0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # a shuffling DataLoader draws its order from torch's generator
            for batch in data:
                batches.append(batch)
                count += _samples_in(batch)
                if count >= max_samples:
                    break
        xs, y = _stacked(batches, what)
        xs, y = [t[:max_samples] for t in xs], y[:max_samples]
        print("mixtrain: notice: %s: %d samples from the first %d batches of the %s, read once under seed=%d%s" % (
            what, len(y), len(batches), type(data).__name__, seed,
            " (max_samples=%d)" % max_samples if count >= max_samples else ""))
        return xs, y
    return _tensors(data, what)  # its error says what data may be


def _check_forward_takes_tensors(script):
    """mixtrain passes the model tensors: a forward taking a dict (or another type) is said so."""
    try:
        arguments = script._c._get_method("forward").schema.arguments[1:]
    except Exception:  # a schema this torch does not expose: the run's own check still applies
        return
    for a in arguments:
        kind = str(a.type)
        if kind not in ("Tensor", "Optional[Tensor]"):
            raise TypeError("the model's forward takes %s: %s; mixtrain passes tensors (x, or the list x as separate "
                            "inputs): give it a forward that takes tensors, e.g. a wrapper module whose forward(x, mask) "
                            "builds the %s" % (a.name, kind, kind))


def _python_calls(module):
    """The Python functions a TorchScript module's graph calls (prim::PythonOp), sorted."""
    return sorted({n.pyname() for n in module.inlined_graph.nodes() if n.kind() == "prim::PythonOp"})


class _quiet_torchscript(warnings.catch_warnings):
    """torch 2.x deprecates torch.jit.script and trace with a DeprecationWarning on every
    call. mixtrain calls them on the user's behalf (its C++ runs TorchScript), so the
    warning is not the user's to act on: it is kept out of their warnings."""

    def __enter__(self):
        out = super().__enter__()
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit\.")
        return out


def _scripted(model, xs, y, loss):
    """The model's TorchScript form, its name, and how it was made."""
    if isinstance(model, torch.jit.ScriptModule):
        return model, type(model).__name__, "a ScriptModule, used as it is"
    if not isinstance(model, torch.nn.Module):
        raise ValueError("model must be a torch.nn.Module or a torch.jit.ScriptModule, not %s" % type(model).__name__)
    name = type(model).__name__
    try:
        with _quiet_torchscript():
            script = torch.jit.script(model)
        calls = _python_calls(script)  # torch 2.x scripts a Python call as a PythonOp, which cannot be saved
        if not calls:
            return script, name, "scripted with torch.jit.script"
        why = "the scripted forward calls Python (%s)" % ", ".join(calls)
    except Exception as e:  # scripting has many ways to fail; tracing needs only one batch
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    example = tuple(t[:2] for t in xs) + ((y[:2],) if _native.loss_takes_targets(loss) else ())
    was_training = model.training
    # Tracing runs the forward once on the caller's module: BatchNorm's running statistics
    # (and any buffer the forward writes) are put back, and a dropout's draws come from a
    # forked generator, so the caller's model and random state are as they were.
    buffers = [(m, n, b.detach().clone()) for m in model.modules() for n, b in m._buffers.items() if b is not None]
    try:
        with warnings.catch_warnings(), _quiet_torchscript(), torch.random.fork_rng(devices=[]):
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            traced = torch.jit.trace(model, example, check_trace=False)
    except Exception as trace_error:
        # Both failed: say why each did (a custom autograd.Function defeats both).
        how = str(trace_error).strip().splitlines()
        raise TypeError("the model cannot be turned into TorchScript: torch.jit.script failed (%s) and "
                        "torch.jit.trace on the first two samples failed (%s)" % (
                            why, how[0] if how else type(trace_error).__name__)) from None
    finally:
        model.train(was_training)
        with torch.no_grad():
            for m, n, saved in buffers:
                if m._buffers.get(n) is not None and m._buffers[n].shape == saved.shape:
                    m._buffers[n].copy_(saved)
    python_calls = _python_calls(traced)
    if python_calls:
        raise TypeError("the model's forward calls Python (%s, e.g. a custom torch.autograd.Function): TorchScript "
                        "cannot hold it, so mixtrain cannot run it (torch.jit.script failed: %s; a trace keeps the "
                        "call as Python, which cannot be saved). Write it with torch ops, or as a C++ custom op" % (
                            ", ".join(python_calls), why))
    how = ("traced on the first batch (torch.jit.script failed: %s); a traced model keeps the train/eval behaviour "
           "it was traced in" % why)
    print("mixtrain: notice: the model was %s" % how)
    return traced, name, how


class _Run:
    """One call's run folder: the caller's `out`, or a temporary one removed afterwards.
    Nothing is read back from it: the run returns what it measured."""

    def __init__(self, out):
        self.keep = out is not None
        self.folder = os.fspath(out) if self.keep else tempfile.mkdtemp(prefix="mixtrain-")

    def close(self):
        if not self.keep:
            shutil.rmtree(self.folder, ignore_errors=True)


def _settings(command, options):
    """The keyword arguments as the option table's text, each checked against its row."""
    rows = {r["key"]: r for r in _rows(command)}
    settings = {}
    for key, value in options.items():
        if key not in rows:
            raise TypeError("%s() got an unexpected keyword argument '%s'" % (command, key))
        text = _text(rows[key], value)
        if text is not None:
            settings[key] = text
    return rows, settings


def _call(command, model, data, valid, out, options, max_samples, extra=None, window=None, loop=None):
    """One run on the caller's model. `extra`: settings the call adds itself (doctor's
    from_run, a loop's precision); `window`: (xs, y), the training loop's next batches, in
    order (the data then); `loop`: that loop's optimizer state for the native half."""
    rows, settings = _settings(command, options)
    settings.update(extra or {})
    seed = int(settings.get("seed", rows["seed"]["default"]))
    xs, y = window if window is not None else _drawn(data, "data", max_samples, seed)
    valid_xs, valid_y = _drawn(valid, "valid", max_samples, seed) if valid is not None else ([], None)
    if window is not None and valid is None:
        valid_xs, valid_y = xs, y  # the window's own samples: the same for both arms
        print("mixtrain: notice: no valid= given: each arm is validated on the window's own %d samples" % len(y))
    if isinstance(model, torch.nn.Module):  # not one: _scripted says what model must be
        # What libtorch would report deep inside the run (meta, all frozen, float64), said
        # first by the run layer's rule (run/stored_model.h), before the model is scripted.
        _native.refuse_untrainable(list(model.parameters()))
    if out is not None:
        # The CLI's rules (run/run_folder.h), asked before the model is touched: "old/q/.."
        # (no q yet) is the folder "old" once created, and holds its run.
        _native.check_out_folder(os.fspath(out), settings.get("force") == "true",
                                 "" if command == "train" else "the doctor" if command == "doctor" else command)
    # The stored-model rule is the run layer's (run/stored_model.h): an fp16 model is a
    # ValueError; a bf16 one, whole or with fp32 modules, is bf16-pure unless chosen otherwise.
    chosen = _native.stored_model_settings(_module_dtypes(model), options.get("precision") is not None,
                                           options.get("keep_fp32") is not None, "from_run" in settings,
                                           command == "doctor")
    stored = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(chosen["stored"])
    islands = chosen["fp32_modules"]
    settings.update(chosen["settings"])
    if chosen["notice"]:
        print("mixtrain: notice: " + chosen["notice"])
    # bf16 values in fp32 storage while mixtrain runs it (exact both ways); each parameter and
    # buffer gets its own dtype back afterwards.
    storage = HeldInFp32([model]) if stored == torch.bfloat16 or islands else None
    precision = settings.get("precision", rows["precision"]["default"])
    if loop is not None and "weight_update" in loop and precision == "bf16-pure":
        # mixtrain.optim's rounding is the loop's: the doctor's bf16-pure arm is the loop as it runs.
        if "weight_update" in options and options["weight_update"] != loop["weight_update"]:
            raise ValueError("weight_update=%r: the loop's optimizer rounds %r, and the doctor replays the loop as it "
                             "runs (its trials try the other rules); drop weight_update=" %
                             (options["weight_update"], loop["weight_update"]))
        settings["weight_update"] = loop["weight_update"]
    loss = options.get("loss") or rows["loss"]["default"]
    run = _Run(out)
    threads = torch.get_num_threads()
    rng = torch.get_rng_state()  # the run seeds torch's global generator, which is also the caller's
    try:
        script, name, how = _scripted(model, xs, y, loss)
        _check_forward_takes_tensors(script)
        native = _native.run(command, script._c, name, xs, y, valid_xs, valid_y, settings, run.folder, run.keep, loop)
        _say_warnings(native, 3)  # the caller's line: the caller, doctor/train/lr_find, _call
        if command == "train":
            _say_what_is_handed_back(stored, precision)
        return native, script, how, run
    except BaseException:
        run.close()
        raise
    finally:
        torch.set_num_threads(threads)  # the run sets its own; the caller's process gets its count back
        torch.set_rng_state(rng)
        if storage is not None:
            # Parameters as they came, but where train() handed back fp32 weights (said so);
            # buffers always as they came.
            storage.restore(parameters=command != "train" or precision == "bf16-pure")


def _say_what_is_handed_back(stored, precision):
    """train() trains the caller's module in place; Result.valid measures exactly the
    weights it holds afterwards. Where those are not what the module came in as, say so."""
    if stored == torch.bfloat16 and precision != "bf16-pure":
        print("mixtrain: notice: the model's parameters came in bf16 and trained as fp32 weights (precision=%r): they "
              "are handed back in fp32, as Result.valid measured them (model.to(torch.bfloat16) would round away "
              "updates smaller than bf16's spacing)" % precision)
    elif stored is None and precision == "bf16-pure":
        print("mixtrain: notice: bf16-pure trained bf16 weights: the model's fp32 parameters now hold bfloat16 values, "
              "as Result.valid measured them")


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _module_dtypes(model):
    """Each module's name and its own floating parameters' dtypes, for the stored-model rule. A
    TorchScript model is read whole (its submodules' own parameters are not its islands)."""
    if not isinstance(model, torch.nn.Module):
        return []
    if isinstance(model, torch.jit.ScriptModule):
        return [("", [_DTYPE_NAMES.get(p.dtype, str(p.dtype)) for p in model.parameters() if p.is_floating_point()])]
    return [(name, [_DTYPE_NAMES.get(p.dtype, str(p.dtype)) for p in module.parameters(recurse=False)
                    if p.is_floating_point()])
            for name, module in model.named_modules()]


# How many samples a Dataset or DataLoader gives at most: enough for the doctor's
# comparison and a quick train, few enough that drawing them stays quick.
_MAX_SAMPLES = 10000


def _svg_html(svg):
    return "<div style='max-width:720px'>%s</div>" % svg if svg else ""


def _loop_lines(settings, ours=False):
    """A proven fix's settings as lines for the user's own PyTorch loop, or None where the
    package has nothing to run yet (fp32 master weights). `ours`: the loop's optimizer is
    mixtrain.optim's already (its rule is changed, not converted)."""
    lines, scaler = [], []
    for s in settings:
        key, value = s["key"], s["value"]
        if key == "keep_fp32":
            lines.append("islands = mixtrain.keep_fp32(model, %r)  # once, before the loop" % value.split(","))
        elif key == "precision" and value == "bf16":
            lines.append("with torch.autocast(device_type, dtype=torch.bfloat16): loss = ...  # bf16 autocast, "
                         "no GradScaler (fp32's exponent range)")
        elif key in ("init_scale", "growth_interval", "growth_factor", "backoff_factor"):
            scaler.append("%s=%s" % (key, value))
        elif key == "weight_update" and ours:
            lines.append("opt.weight_update = %r  # mixtrain's optimizer already: only its rounding changes" % value)
        elif key == "weight_update":
            lines.append("opt = mixtrain.optim.from_torch(opt, weight_update=%r)  # your optimizer, its state and "
                         "hyper-parameters, each update rounded %s" % (value, {
                             "stochastic": "stochastically", "kahan": "with Kahan compensation",
                             "nearest": "to nearest"}.get(value, value)))
        elif key == "precision" and value == "bf16-pure":
            continue  # the loop's own mode (a bf16 model): its other settings say the change
        elif key == "clip":
            lines.append("scaler.unscale_(opt); torch.nn.utils.clip_grad_norm_(model.parameters(), %s)  # before "
                         "scaler.step(opt)" % value)
        else:
            return None
    if scaler:
        lines.insert(0, "scaler = torch.amp.GradScaler(device_type, %s)" % ", ".join(scaler))
    return lines


class Diagnosis:
    """The doctor's judgement: ``verdict``, ``headline``, ``evidence`` (the report's
    evidence lines), ``fixes`` (its fix lines, most targeted first), ``trials``,
    ``proven_fix`` (None when no fix was proven), ``measurements`` (what the evidence
    was read from: both runs, the overflow traces, the gradient and input checks),
    ``report`` (the CLI's text, options named as keyword arguments), ``charts``
    (SVG text), ``model_source`` (how the model became TorchScript) and ``loop_lines``
    (from a training loop's state: the proven fix as the lines to paste into that loop,
    also in ``proven_fix["loop"]`` and the report; None otherwise)."""

    def __init__(self, native, how, charts, loop=False, ours=False):
        self._dict = json.loads(native["diagnosis"])
        self.report = native["report"]
        self.model_source = how
        self.charts = charts
        for key in ("verdict", "headline", "fixes", "trials", "proven_fix"):
            setattr(self, key, self._dict.get(key))
        # From a training loop's state: the proven fix as the lines to paste into that loop.
        self.loop_lines = _loop_lines(self.proven_fix["settings"], ours) if loop and self.proven_fix else None
        if self.loop_lines:
            self.proven_fix = dict(self.proven_fix, loop=self.loop_lines)
            self.report = self.report.rstrip("\n") + "\nin your loop:\n" + "".join("  %s\n" % l for l in self.loop_lines)
        elif loop and self.proven_fix:
            self.report = self.report.rstrip("\n") + ("\nin your loop: not yet (%s has no line for a plain loop in "
                                                       "this package yet)\n" % self.proven_fix["flags"])
        self.islands = None  # apply()'s keep_fp32 handle
        self.evidence = list(self._dict.get("findings") or [])  # the report's evidence lines
        self.measurements = self._dict.get("evidence")  # what they were read from: both runs, traces, checks

    @property
    def healthy(self):
        return self.verdict == "healthy"

    def apply(self, model, optimizer):
        """Does what ``loop_lines`` say, on your model and optimizer, and returns the optimizer to
        go on with: ``weight_update`` converts it (``mixtrain.optim.from_torch``, its state and
        hyper-parameters kept; a mixtrain optimizer has its rule changed), ``keep_fp32`` makes the
        islands (their handle is ``self.islands``). What is your loop's own code (autocast's
        dtype, a GradScaler's settings, clipping) it cannot do: it warns with those lines, to
        write. A diagnosis with no proven fix, or one whose fix has no line for a plain loop,
        is a ValueError."""
        if not self.proven_fix:
            raise ValueError("apply: the doctor proved no fix (verdict %s): there is nothing to apply" % self.verdict)
        if not self.loop_lines:
            raise ValueError("apply: the proven fix (%s) has no line for a plain loop in this package yet" %
                             self.proven_fix["flags"])
        if not isinstance(model, torch.nn.Module):
            raise ValueError("apply: model must be a torch.nn.Module, got %s" % type(model).__name__)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError("apply: optimizer must be a torch.optim optimizer, got %s" % type(optimizer).__name__)
        by_key = {s["key"]: s["value"] for s in self.proven_fix["settings"]}
        # The lines of the settings apply() cannot do itself: the loop's own code.
        to_write = _loop_lines([s for s in self.proven_fix["settings"] if s["key"] not in ("weight_update", "keep_fp32")])
        if "weight_update" in by_key:
            rule = by_key["weight_update"]
            if isinstance(optimizer, optim._RoundedOptimizer):
                optimizer.weight_update = rule
            else:
                optimizer = optim.from_torch(optimizer, weight_update=rule)
        if "keep_fp32" in by_key:
            self.islands = keep_fp32(model, by_key["keep_fp32"].split(","))
        if to_write:
            warnings.warn("apply: the rest of the proven fix is your loop's own code; write: %s" % "; ".join(to_write),
                          stacklevel=2)
        return optimizer

    def to_dict(self):
        """diagnosis.json's content, with ``model_source``."""
        return dict(self._dict, model_source=self.model_source)

    def __repr__(self):
        # The headline starts with the verdict's name ("lost_updates: ..."): said once.
        headline = self.headline
        if headline.startswith(self.verdict + ": "):
            headline = headline[len(self.verdict) + 2:]
        return "<mixtrain.Diagnosis %s: %s>" % (self.verdict, headline)

    def __str__(self):
        return self.report

    def _repr_html_(self):
        import html
        return "<pre>%s</pre>%s" % (html.escape(self.report), _svg_html(self.charts.get("loss")))


class Result:
    """A training run: ``model`` (the trained TorchScript module: call it, or
    torch.jit.save it; an eager model that was scripted shares its parameters, so
    it is trained too), ``epochs`` (one dict per epoch), ``steps`` (per-step loss,
    lr, loss scale and skipped flag), ``summary``, ``charts`` (SVG text),
    ``stopped`` (why the run stopped early on a NaN loss, else None) and
    ``valid`` (the validation metrics of ``model`` as returned: with master
    weights the fp32 masters, validated once more after training, while
    ``epochs`` holds what the 16-bit copy that trained measured)."""

    def __init__(self, model, how, native):
        self.model = model
        self.model_source = how
        self.epochs = native["epochs"]
        self.steps = native["steps"]
        self.summary = json.loads(native["summary"]) if native["summary"] else {}
        self.summary["model_source"] = how
        self.charts = dict(native["charts"])
        self.stopped = native.get("stopped")
        last = dict(self.epochs[-1]) if self.epochs else {}
        returned = {k[len("returned_valid_"):]: v for k, v in self.summary.items() if k.startswith("returned_valid_")}
        if returned:  # master weights: the masters' own validation
            self.valid = dict(returned, valid_loss=returned.pop("loss"))
        else:
            self.valid = {k: v for k, v in last.items() if k not in ("epoch", "train_loss", "seconds")}

    @property
    def skipped_steps(self):
        return sum(1 for s in self.steps.get("skipped", []) if s)

    def __repr__(self):
        last = self.epochs[-1] if self.epochs else {}
        return "<mixtrain.Result %d epoch(s), valid_loss %s, skipped %d step(s)%s>" % (
            len(self.epochs), last.get("valid_loss"), self.skipped_steps, ", stopped" if self.stopped else "")

    def _repr_html_(self):
        import html
        head = "".join("<th>%s</th>" % html.escape(k) for k in (self.epochs[0] if self.epochs else {}))
        body = "".join("<tr>%s</tr>" % "".join("<td>%s</td>" % html.escape(str(v)) for v in row.values())
                       for row in self.epochs)
        note = "<p>stopped: %s</p>" % html.escape(self.stopped) if self.stopped else ""
        return "<table><tr>%s</tr>%s</table>%s%s" % (head, body, note, _svg_html(self.charts.get("loss")))


class LrFind:
    """fastai's learning-rate finder: the suggestions ``valley``, ``steep`` and
    ``minimum`` (the minimum's lr / 10), the sweep's ``lrs`` and ``losses``,
    ``diverged``, and the chart ``svg``."""

    def __init__(self, native):
        for key in ("valley", "steep", "minimum", "lrs", "losses", "diverged", "svg"):
            setattr(self, key, native[key])

    def __repr__(self):
        return "<mixtrain.LrFind valley %.2e, steep %.2e, minimum/10 %.2e>" % (self.valley, self.steep, self.minimum)

    def _repr_svg_(self):
        return self.svg


# The torch.optim optimizers a training loop's state is read from, as the Learner names them.
_LOOP_OPTIMIZERS = {torch.optim.AdamW: "adamw", torch.optim.Adam: "adam", torch.optim.SGD: "sgd",
                    torch.optim.RMSprop: "rmsprop", torch.optim.Adagrad: "adagrad",
                    # mixtrain's own, after a cure (its rule is the doctor's to try, not to keep)
                    optim.AdamW: "adamw", optim.Adam: "adam", optim.SGD: "sgd", optim.RMSprop: "rmsprop",
                    optim.Adagrad: "adagrad"}


def _number(v):
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def _loop_state(model, optimizer):
    """What the native half needs of a torch.optim optimizer: its kind, its param groups
    (by the model's parameter names) and each parameter's state, as fp32 tensors."""
    kind = _LOOP_OPTIMIZERS.get(type(optimizer))
    if kind is None:
        raise ValueError("optimizer is a %s: the doctor takes the state of torch.optim.AdamW, Adam, SGD, RMSprop or "
                         "Adagrad (or mixtrain.optim's)" %
                         type(optimizer).__name__)
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    groups, held = [], set()
    for g in optimizer.param_groups:
        if g.get("maximize"):
            raise ValueError("optimizer has maximize=True: the doctor minimizes the loss; pass an optimizer that does")
        if kind == "adam" and g.get("decoupled_weight_decay"):
            if not isinstance(optimizer, optim.Adam):
                raise ValueError("optimizer is Adam with decoupled_weight_decay=True: pass it as torch.optim.AdamW")
            kind = "adamw"  # mixtrain.optim.AdamW's groups say so
        params = []
        for p in g["params"]:
            if id(p) not in names:
                raise ValueError("optimizer holds a tensor of shape %s that is not a parameter of the model: pass the "
                                 "optimizer that trains this model" % (tuple(p.shape),))
            params.append(names[id(p)])
            held.add(id(p))
        betas = g.get("betas", (0.9, 0.999))
        groups.append(dict(params=params, lr=_number(g["lr"]), weight_decay=_number(g.get("weight_decay", 0)),
                           eps=_number(g.get("eps", 1e-8)), beta1=_number(betas[0]), beta2=_number(betas[1]),
                           momentum=_number(g.get("momentum", 0)), dampening=_number(g.get("dampening", 0)),
                           nesterov=bool(g.get("nesterov", False)), amsgrad=bool(g.get("amsgrad", False)),
                           alpha=_number(g.get("alpha", 0.99)), centered=bool(g.get("centered", False)),
                           lr_decay=_number(g.get("lr_decay", 0)),
                           initial_accumulator_value=_number(g.get("initial_accumulator_value", 0))))
    if not groups:
        raise ValueError("optimizer holds no parameters")
    if len({g["lr"] for g in groups}) > 1:
        raise ValueError("optimizer's param groups have different learning rates (%s): the doctor replays one" %
                         ", ".join("%g" % g["lr"] for g in groups))
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in held:
            raise ValueError("the model's parameter %s is not in the optimizer, so your loop does not train it but the "
                             "doctor would: freeze it (requires_grad_(False)) or add it to the optimizer" % name)
    state = {}
    for p in (p for g in optimizer.param_groups for p in g["params"]):
        name, st = names[id(p)], optimizer.state.get(p)
        if st:
            state[name] = {k: (v.detach().to("cpu", torch.float32) if v.dim() else torch.tensor(float(v.item())))
                           if isinstance(v, torch.Tensor) else torch.tensor(float(v))
                           for k, v in st.items() if isinstance(v, (torch.Tensor, numbers.Real))}
    loop = dict(optimizer=kind, groups=groups, state=state,
                # The stream the loop's stochastic rounding draws from: mixtrain.optim's seed, or
                # from_torch's default for a torch.optim optimizer (what the cure hands over).
                rounding_seed=optimizer.seed if isinstance(optimizer, optim._RoundedOptimizer) else 0)
    if isinstance(optimizer, optim._RoundedOptimizer):
        loop["weight_update"] = optimizer.weight_update  # bf16-pure's arm rounds as the loop does
    return loop


def _loop_window(data, steps, bs):
    """The training loop's next `steps` batches of `data`, in order, as (xs, y) and their
    batch size: an iterable of (x, y) batches (a DataLoader, or an iterator where the loop
    stands) gives its next batches; (x, y) tensors give their first steps * bs samples."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and _as_tensor(data[1]) is not None:
        xs, y = _tensors(data, "data")
        if len(y) < steps * bs:
            raise ValueError("data holds %d samples: too few for steps=%d batches of bs=%d" % (len(y), steps, bs))
        return [t[:steps * bs] for t in xs], y[:steps * bs], bs
    if not hasattr(data, "__iter__") or isinstance(data, (str, bytes, dict, torch.Tensor)):
        raise ValueError("data must be (x, y) tensors or an iterable of (x, y) batches (a DataLoader) for steps=; got %s" %
                         type(data).__name__)
    batches = []
    # A shuffling DataLoader draws its order from torch's generator, which is the caller's too.
    with torch.random.fork_rng(devices=[]):
        for batch in data:
            batches.append(batch)
            if len(batches) == steps:
                break
    if hasattr(data, "__next__"):  # an iterator (where the loop stands), not a re-iterable DataLoader
        print("mixtrain: notice: the doctor read the next %d batch%s of your data iterator: your loop goes on after "
              "them" % (len(batches), "" if len(batches) == 1 else "es"))
    if len(batches) < steps:
        raise ValueError("data gave %d batch%s: too few for steps=%d" % (len(batches), "" if len(batches) == 1 else "es",
                                                                       steps))
    xs, y = _stacked(batches, "data")
    sizes = [len(_pair(b)[1]) if _pair(b) else 0 for b in batches]
    if len(set(sizes)) != 1:
        raise ValueError("data's batches hold different numbers of samples (%s): the window replays batches of one size" %
                         ", ".join(str(n) for n in sorted(set(sizes))))
    return xs, y, sizes[0]


def doctor(model=None, data=None, *, valid=None, out=None, max_samples=_MAX_SAMPLES, optimizer=None, scaler=None,
           steps=None, from_run=None, at=None, window=None, **options):
    loop_given = optimizer is not None or scaler is not None or steps is not None
    if from_run is not None:
        if loop_given:
            raise ValueError("from_run= branches from a run folder's checkpoint, optimizer=/scaler=/steps= from a "
                             "training loop's state: pass one or the other")
        if (model is None) != (data is None):
            raise ValueError("doctor(from_run=...) takes the run's model and data together (a run trained from Python), "
                             "or neither (a run the CLI trained, whose folder names them)")
        if not os.fspath(from_run):
            raise ValueError("from_run= is empty: give the run folder to branch from")
        extra = {"from_run": os.fspath(from_run)}
        for key, value, least in (("at", at, 0), ("window", window, 1)):
            if value is not None:
                if not _is_integer(value) or value < least:
                    raise ValueError("invalid %s=%r: an integer >= %d%s" % (
                        key, value, least, " (a training step; None picks one)" if key == "at" else ""))
                extra[key] = str(int(value))
        if model is None:
            _, settings = _settings("doctor", options)
            settings.update(extra)
            run = _Run(out)
            try:
                native = _native.run("doctor", None, "", [], torch.empty(0), [], None, settings, run.folder, run.keep)
                _say_warnings(native, 2)
            finally:
                run.close()
            return Diagnosis(native, "the run's own model (%s)" % extra["from_run"], dict(native["charts"]))
        native, script, how, run = _call("doctor", model, data, valid, out, options, max_samples, extra=extra)
        run.close()
        return Diagnosis(native, how, dict(native["charts"]))
    if at is not None or window is not None:
        raise ValueError("at= and window= pick what from_run= replays; without it the doctor trains both runs from scratch")
    if model is None or data is None:
        raise TypeError("doctor() needs the model and data (or from_run=, a run folder)")
    if not loop_given:
        native, script, how, run = _call("doctor", model, data, valid, out, options, max_samples)
        run.close()
        return Diagnosis(native, how, dict(native["charts"]))
    # A training loop's state: the next `steps` batches from the model's weights and the optimizer's state.
    if optimizer is None or steps is None:
        raise ValueError("a training loop's state takes optimizer= and steps= (scaler= with a GradScaler)")
    least = _native.MIN_COMPARE_STEPS
    if not _is_integer(steps) or steps < least:
        raise ValueError("invalid steps=%r: an integer >= %d (the comparison needs at least %d steps)" % (
            steps, least, least))
    tensors = isinstance(data, (tuple, list)) and len(data) == 2 and _as_tensor(data[1]) is not None
    for key in ("lr", "epochs") + (() if tensors else ("bs",)):
        if key in options:
            raise ValueError("%s= comes from the training loop (the optimizer's lr, one window of steps= batches of "
                             "data's size); drop it" % key)
    if not isinstance(model, torch.nn.Module) or isinstance(model, torch.jit.ScriptModule):
        raise ValueError("optimizer= needs the eager torch.nn.Module the optimizer trains")
    loop = _loop_state(model, optimizer)
    extra = {}
    if scaler is not None and (not hasattr(scaler, "get_scale") or scaler.is_enabled()):
        if not hasattr(scaler, "get_scale"):
            raise ValueError("scaler is a %s, not a torch.amp.GradScaler" % type(scaler).__name__)
        if not (0 < float(scaler.get_scale()) < float("inf")):
            raise ValueError("the GradScaler's scale is %r: a loss scale is a finite number > 0 (a scaler whose scale "
                             "grew past fp32's range has gone wrong before the doctor: pass a fresh "
                             "torch.amp.GradScaler, or one loaded from a checkpoint before it)" % float(scaler.get_scale()))
        if options.get("precision") not in (None, "fp16"):
            raise ValueError("scaler= is fp16's GradScaler, but precision=%r" % (options["precision"],))
        extra = {"precision": "fp16", "init_scale": repr(float(scaler.get_scale())),
                 "growth_factor": repr(float(scaler.get_growth_factor())),
                 "backoff_factor": repr(float(scaler.get_backoff_factor())),
                 "growth_interval": str(int(scaler.get_growth_interval()))}
    rows, settings = _settings("doctor", options)
    bs = int(settings.get("bs", rows["bs"]["default"]))
    if tensors and "bs" not in settings:
        print("mixtrain: notice: data= is (x, y) tensors: the window is steps=%d batches of bs=%d (the default); pass "
              "bs= to give your loop's batch size" % (int(steps), bs))
    xs, y, bs = _loop_window(data, int(steps), bs)
    extra["bs"] = str(bs)
    native, script, how, run = _call("doctor", model, None, valid, out, options, max_samples, extra=extra,
                                     window=(xs, y), loop=loop)
    run.close()
    return Diagnosis(native, how, dict(native["charts"]), loop=True,
                     ours=isinstance(optimizer, optim._RoundedOptimizer))


def train(model, data, *, valid=None, out=None, max_samples=_MAX_SAMPLES, **options):
    native, script, how, run = _call("train", model, data, valid, out, options, max_samples)
    run.close()
    result = Result(script, how, native)
    if result.stopped:
        warnings.warn("mixtrain.train stopped: " + result.stopped, MixtrainWarning, stacklevel=2)
    return result


def lr_find(model, data, *, valid=None, out=None, max_samples=_MAX_SAMPLES, **options):
    native, _, _, run = _call("lr_find", model, data, valid, out, options, max_samples)
    run.close()
    return LrFind(native)


_SUMMARIES = {
    "doctor": "Trains the model twice from the same weights, seed and data order, in fp32 and in mixed precision "
              "(emulated fp16 on a CPU), judges the difference and, for a problem, tries the candidate fixes. "
              "Returns a Diagnosis.",
    "train": "Trains the model with fastai's one-cycle schedule in the chosen precision and returns a Result; "
             "the module is trained in place.",
    "lr_find": "fastai's learning-rate finder: an exponential lr sweep on copies of the model's weights. "
               "Returns an LrFind.",
}


# doctor's own keywords: where it branches from (a training loop's state, or a run folder).
_BRANCH_HELP = [
    "optimizer, scaler, steps: branch from where your own training loop stands: the model's weights, the state of "
    "optimizer (torch.optim.AdamW, Adam, SGD, RMSprop, Adagrad or mixtrain.optim's: moments, step counts, momentum "
    "buffers, its lr and weight decay) and "
    "a GradScaler's scale (fp16). The window is the next `steps` batches of data (an iterator continues where your "
    "loop is, and the doctor uses up those `steps` batches of it: your loop goes on after them; a DataLoader is "
    "iterated afresh, its shuffle drawn without moving your random state; (x, y) tensors are cut into batches of "
    "bs), at the optimizer's lr, in fp32 and in the loop's precision (bf16 weights: bf16-pure; a scaler: fp16). "
    "Without valid, each arm is validated on the window's samples.",
    "from_run, at, window: branch from a run folder's checkpoint (the CLI's doctor --from RUN --at STEP --window N); "
    "pass the model and data again for a run trained from Python.", ""]


def _document(function, command):
    """The signature and help of `function`: the option table's rows for `command`."""
    P = inspect.Parameter
    required = P.empty if command != "doctor" else None  # the doctor of a run folder takes neither
    params = [P("model", P.POSITIONAL_OR_KEYWORD, default=required), P("data", P.POSITIONAL_OR_KEYWORD, default=required),
              P("valid", P.KEYWORD_ONLY, default=None), P("out", P.KEYWORD_ONLY, default=None),
              P("max_samples", P.KEYWORD_ONLY, default=_MAX_SAMPLES)]
    if command == "doctor":
        params += [P(k, P.KEYWORD_ONLY, default=None) for k in ("optimizer", "scaler", "steps", "from_run", "at", "window")]
    lines = [_SUMMARIES[command], "",
             "model: a torch.nn.Module (scripted, or traced on the first batch where scripting fails) or ScriptModule.",
             "data, valid: (x, y), x a tensor or a list of tensors (numpy arrays too); a map-style Dataset of (x, y) "
             "samples; or an iterable of (x, y) batches (a DataLoader). Without valid a seeded 20% of data is kept aside.",
             "max_samples: at most this many samples are drawn from a Dataset or an iterable, once, in an order seeded "
             "by seed (tensors are used whole).",
             "out: a folder for the run's files (the CLI's); None writes nothing.", ""] + (
                 _BRANCH_HELP if command == "doctor" else [])
    for row in _rows(command):
        params.append(P(row["key"], P.KEYWORD_ONLY, default=_default(row)))
        lines.append("%s: %s" % (row["key"], row["help"]))
    function.__signature__ = inspect.Signature(params)
    function.__doc__ = "\n".join(lines)


for _f, _c in ((doctor, "doctor"), (train, "train"), (lr_find, "lr_find")):
    _document(_f, _c)
del _f, _c

from .watch import Watch, WatchReport, watch  # noqa: E402 (it reads _loop_lines and MixtrainWarning)
