"""mixtrain from Python: the doctor, lr_find and mixed-precision training for a
PyTorch model object and tensors, with no files written unless ``out`` is given.

In a notebook::

    import mixtrain
    d = mixtrain.doctor(model, (x, y))   # an nn.Module (or ScriptModule) and its data
    d                                    # the verdict, the fixes and the loss chart
    d.proven_fix                         # the fix the doctor tried and saw work
    r = mixtrain.train(model, (x, y), precision="fp16", epochs=3)

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

from . import _native

__all__ = ["doctor", "train", "lr_find", "Diagnosis", "Result", "LrFind"]

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
    bad = ValueError("invalid %s=%r: %s" % (key, value, {
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


def _tensors(data, what):
    """(x, y) with x a tensor or a list/tuple of tensors: the model's inputs, the targets."""
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError("%s must be (x, y): x a tensor or a list of tensors (the model's inputs), y the targets; got %s"
                         % (what, type(data).__name__))
    x, y = data
    xs = [x] if isinstance(x, torch.Tensor) else list(x) if isinstance(x, (list, tuple)) else None
    if not xs:
        raise ValueError("%s: x is a %s, not a tensor or a list of tensors" % (what, type(x).__name__))
    for i, t in enumerate(xs):
        if not isinstance(t, torch.Tensor):
            raise ValueError("%s: x[%d] is a %s, not a tensor" % (what, i, type(t).__name__))
    if not isinstance(y, torch.Tensor):
        raise ValueError("%s: y is a %s, not a tensor" % (what, type(y).__name__))
    return [t.detach().cpu() for t in xs], y.detach().cpu()


def _scripted(model, xs, y, loss):
    """The model's TorchScript form, its name, and how it was made."""
    if isinstance(model, torch.jit.ScriptModule):
        return model, type(model).__name__, "a ScriptModule, used as it is"
    if not isinstance(model, torch.nn.Module):
        raise ValueError("model must be a torch.nn.Module or a torch.jit.ScriptModule, not %s" % type(model).__name__)
    name = type(model).__name__
    try:
        return torch.jit.script(model), name, "scripted with torch.jit.script"
    except Exception as e:  # scripting has many ways to fail; tracing needs only one batch
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        example = tuple(t[:2] for t in xs) + ((y[:2],) if _native.loss_takes_targets(loss) else ())
        was_training = model.training
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            traced = torch.jit.trace(model, example, check_trace=False)
        model.train(was_training)
        return traced, name, ("traced on the first batch (torch.jit.script failed: %s); a traced model keeps the "
                              "train/eval behaviour it was traced in" % why)


class _Run:
    """One call's run folder: the caller's `out`, or a temporary one removed afterwards.
    Nothing is read back from it: the run returns what it measured."""

    def __init__(self, out):
        self.keep = out is not None
        self.folder = os.fspath(out) if self.keep else tempfile.mkdtemp(prefix="mixtrain-")

    def close(self):
        if not self.keep:
            shutil.rmtree(self.folder, ignore_errors=True)


def _call(command, model, data, valid, out, options):
    rows = {r["key"]: r for r in _rows(command)}
    settings = {}
    for key, value in options.items():
        if key not in rows:
            raise TypeError("%s() got an unexpected keyword argument '%s'" % (command, key))
        text = _text(rows[key], value)
        if text is not None:
            settings[key] = text
    xs, y = _tensors(data, "data")
    valid_xs, valid_y = _tensors(valid, "valid") if valid is not None else ([], None)
    stored = _stored_dtype(model)
    if stored == torch.float16:
        raise ValueError("the model's parameters are fp16, which mixtrain does not train without an fp32 copy (its "
                         "updates round away and its range overflows); pass model.float() with precision=\"fp16\" "
                         "(autocast), or model.to(torch.bfloat16) for precision=\"bf16-pure\"")
    if stored == torch.bfloat16:
        # The user's pure-bf16 setup: bf16 weights and optimizer state, no fp32 copy.
        if "precision" not in options or options["precision"] is None:
            settings["precision"] = "bf16-pure"
            print("mixtrain: notice: the model's parameters are bf16: %s it as bf16-pure (bf16 weights, gradients and "
                  "optimizer state, no fp32 copy); pass precision= to choose another mode" %
                  ("diagnosing" if command == "doctor" else "training"))
        model.float()  # bf16 values in fp32 storage while mixtrain runs it (exact both ways)
    loss = options.get("loss") or rows["loss"]["default"]
    run = _Run(out)
    threads = torch.get_num_threads()
    try:
        script, name, how = _scripted(model, xs, y, loss)
        native = _native.run(command, script._c, name, xs, y, valid_xs, valid_y, settings, run.folder, run.keep)
        return native, script, how, run
    except BaseException:
        run.close()
        raise
    finally:
        torch.set_num_threads(threads)  # the run sets its own; the caller's process gets its count back
        if stored == torch.bfloat16:
            model.to(torch.bfloat16)  # the model is given back as it came: bf16


def _stored_dtype(model):
    """The floating dtype of the model's parameters when they are all half or all
    bfloat16, else None (fp32, or a mix mixtrain's modes handle themselves)."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()} if isinstance(model, torch.nn.Module) else set()
    return dtypes.pop() if len(dtypes) == 1 and next(iter(dtypes)) in (torch.float16, torch.bfloat16) else None


def _svg_html(svg):
    return "<div style='max-width:720px'>%s</div>" % svg if svg else ""


class Diagnosis:
    """The doctor's judgement: ``verdict``, ``headline``, ``evidence``, ``fixes``,
    ``trials``, ``proven_fix`` (None when no fix was proven), ``report`` (the
    CLI's text, options named as keyword arguments), ``charts`` (SVG text) and
    ``model_source`` (how the model became TorchScript)."""

    def __init__(self, native, how, charts):
        self._dict = json.loads(native["diagnosis"])
        self.report = native["report"]
        self.model_source = how
        self.charts = charts
        for key in ("verdict", "headline", "evidence", "fixes", "trials", "proven_fix"):
            setattr(self, key, self._dict.get(key))

    @property
    def healthy(self):
        return self.verdict == "healthy"

    def to_dict(self):
        """diagnosis.json's content, with ``model_source``."""
        return dict(self._dict, model_source=self.model_source)

    def __repr__(self):
        return "<mixtrain.Diagnosis %s: %s>" % (self.verdict, self.headline)

    def __str__(self):
        return self.report

    def _repr_html_(self):
        import html
        return "<pre>%s</pre>%s" % (html.escape(self.report), _svg_html(self.charts.get("loss")))


class Result:
    """A training run: ``model`` (the trained TorchScript module: call it, or
    torch.jit.save it; an eager model that was scripted shares its parameters, so
    it is trained too), ``epochs`` (one dict per epoch), ``steps`` (per-step loss,
    lr, loss scale and skipped flag), ``summary``, ``charts`` (SVG text) and
    ``stopped`` (why the run stopped early on a NaN loss, else None)."""

    def __init__(self, model, how, native):
        self.model = model
        self.model_source = how
        self.epochs = native["epochs"]
        self.steps = native["steps"]
        self.summary = json.loads(native["summary"]) if native["summary"] else {}
        self.charts = dict(native["charts"])
        self.stopped = native.get("stopped")

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


def doctor(model, data, *, valid=None, out=None, **options):
    native, script, how, run = _call("doctor", model, data, valid, out, options)
    run.close()
    return Diagnosis(native, how, dict(native["charts"]))


def train(model, data, *, valid=None, out=None, **options):
    native, script, how, run = _call("train", model, data, valid, out, options)
    run.close()
    result = Result(script, how, native)
    if result.stopped:
        warnings.warn("mixtrain.train stopped: " + result.stopped, RuntimeWarning, stacklevel=2)
    return result


def lr_find(model, data, *, valid=None, out=None, **options):
    native, _, _, run = _call("lr_find", model, data, valid, out, options)
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


def _document(function, command):
    """The signature and help of `function`: the option table's rows for `command`."""
    P = inspect.Parameter
    params = [P("model", P.POSITIONAL_OR_KEYWORD), P("data", P.POSITIONAL_OR_KEYWORD),
              P("valid", P.KEYWORD_ONLY, default=None), P("out", P.KEYWORD_ONLY, default=None)]
    lines = [_SUMMARIES[command], "",
             "model: a torch.nn.Module (scripted, or traced on the first batch where scripting fails) or ScriptModule.",
             "data, valid: (x, y), x a tensor or a list of tensors; without valid a seeded 20% of data is kept aside.",
             "out: a folder for the run's files (the CLI's); None writes nothing.", ""]
    for row in _rows(command):
        params.append(P(row["key"], P.KEYWORD_ONLY, default=_default(row)))
        lines.append("%s: %s" % (row["key"], row["help"]))
    function.__signature__ = inspect.Signature(params)
    function.__doc__ = "\n".join(lines)


for _f, _c in ((doctor, "doctor"), (train, "train"), (lr_find, "lr_find")):
    _document(_f, _c)
del _f, _c
