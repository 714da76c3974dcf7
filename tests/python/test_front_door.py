"""The Python front door (python/mixtrain), as a notebook user calls it: eager
models and tensors in, a Diagnosis / Result / LrFind out, no files unless asked.
Run by ctest (PythonFrontDoor) with PYTHONPATH set to the build tree's package.
"""
import copy
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from typing import Dict

import pytest
import torch
import torch.nn as nn

import mixtrain
from correct_root import correctly_rounded_root  # tests/python/correct_root.py
from shared_models import Overflowing  # tests/python/shared_models.py


def blobs(n=1024, seed=0):
    """Three nearly separable classes in 20 dimensions, normalized."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    y = (x @ torch.randn(20, 3, generator=torch.Generator().manual_seed(2))).argmax(1)
    return x, y


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.body(x))


class DictOut(nn.Module):  # Hugging Face's shape
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.classifier = nn.Linear(32, 3)

    def forward(self, x) -> Dict[str, torch.Tensor]:
        h = self.body(x)
        return {"hidden": h, "logits": self.classifier(h)}


class Unscriptable(Mlp):
    def forward(self, *inputs):  # TorchScript has no *args; tracing takes the inputs as they come
        return self.head(self.body(inputs[0]))


class TakesDict(Mlp):
    def forward(self, batch: Dict[str, torch.Tensor]):
        return self.head(self.body(batch["x"]))


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class CallsAutogradFunction(Mlp):
    def forward(self, x):
        return self.head(self.body(Doubled.apply(x)))


FAST = dict(bs=32, lr=1e-2, threads=1)


@pytest.fixture(autouse=True)
def seeded(tmp_path, monkeypatch):
    torch.manual_seed(0)
    monkeypatch.chdir(tmp_path)  # a run that wrote files by default would leave them here


def test_the_doctor_names_an_overflowing_layer_and_proves_its_fix(tmp_path):
    d = mixtrain.doctor(Overflowing(), blobs(), **FAST)
    assert d.verdict == "forward_overflow", d.report
    assert d.measurements["first_overflow"]["where"] == "proj (aten::linear)"
    assert any("proj (aten::linear)" in line for line in d.evidence), d.evidence  # the report's evidence lines
    assert all(line in d.report for line in d.evidence + d.fixes)
    assert d.proven_fix is not None, d.report
    assert d.proven_fix["flags"] == 'keep_fp32=["proj"]'  # in Python's words, ready to pass back
    assert "keep_fp32=" in d.fixes[0]
    assert d.model_source == "scripted with torch.jit.script"
    assert "<svg" in d._repr_html_() and "forward_overflow" in d._repr_html_()
    assert repr(d).startswith("<mixtrain.Diagnosis forward_overflow: an fp16 activation overflows"), repr(d)
    assert repr(d).count("forward_overflow") == 1, repr(d)  # the verdict is named once
    assert os.listdir(tmp_path) == []  # out=None writes nothing


def test_the_proven_fix_passed_back_trains_without_overflow():
    model = Overflowing()
    r = mixtrain.train(model, blobs(), precision="fp16", epochs=3, keep_fp32=["proj"], **FAST)
    assert r.skipped_steps == 0 and r.stopped is None
    assert r.epochs[-1]["accuracy"] > 0.8


def test_a_healthy_eager_model_is_healthy_and_out_keeps_the_files(tmp_path):
    d = mixtrain.doctor(Mlp(), blobs(), out=tmp_path / "run", **FAST)
    assert d.verdict == "healthy", d.report
    assert d.healthy and d.proven_fix is None
    assert sorted(os.listdir(tmp_path / "run")) == ["diagnosis.json", "loss.svg", "scale.svg"]
    assert d.to_dict()["verdict"] == "healthy"


def test_train_trains_the_module_in_place_and_python_calls_it():
    model = Mlp()
    before = model.head.weight.detach().clone()
    x, y = blobs()
    vx, vy = blobs(256, seed=1)
    r = mixtrain.train(model, (x, y), valid=(vx, vy), precision="fp16", epochs=3, **FAST)
    assert len(r.epochs) == 3 and set(r.steps) >= {"loss", "lr", "scale", "skipped"}
    assert r.summary["precision"] == "fp16" and r.summary["emulated"] is True
    assert "loss" in r.charts and "scale" in r.charts
    with torch.no_grad():
        accuracy = (r.model(vx).argmax(1) == vy).float().mean().item()
        eager = (model(vx).argmax(1) == vy).float().mean().item()
    assert accuracy > 0.85
    assert abs(accuracy - r.epochs[-1]["accuracy"]) <= 3 / 256  # fp32 inference vs fp16-validated training
    assert eager == accuracy  # the scripted module shares the eager one's parameters
    assert not torch.equal(before, model.head.weight)
    assert model.head.weight.dtype == torch.float32


def test_with_master_weights_valid_is_what_the_returned_model_measures(capfd):
    x, y = blobs()
    vx, vy = blobs(256, seed=1)
    ce = nn.CrossEntropyLoss()
    for precision in ("bf16-master", "bf16"):
        model = Mlp()
        r = mixtrain.train(model, (x, y), valid=(vx, vy), precision=precision, epochs=2, **FAST)
        with torch.no_grad():
            out = r.model(vx)
        accuracy = (out.argmax(1) == vy).float().mean().item()
        if precision == "bf16-master":
            # The masters, validated in fp32 after training, as the user's own code sees them.
            assert r.valid["accuracy"] == accuracy
            assert r.summary["returned_weights"] == "fp32 masters"
            # mean over 8 batches of 32 vs over all 256: fp32 rounding only
            assert abs(r.valid["valid_loss"] - ce(out, vy).item()) < 1e-5
            said = capfd.readouterr().out.strip().splitlines()[-1]
            assert "(the fp32 master weights handed back; the bf16 copy validated in training: valid accuracy" in said
            assert said.startswith("valid accuracy %.4f" % accuracy)
        else:  # autocast: validated as trained, and reported as the last epoch
            assert r.valid["accuracy"] == r.epochs[-1]["accuracy"]
            assert "returned_weights" not in r.summary


def test_lr_find_suggests_and_draws():
    f = mixtrain.lr_find(Mlp(), blobs(), bs=32, threads=1, num_it=40)
    assert 1e-7 < f.steep < 10 and 1e-7 < f.valley < 10
    assert len(f.lrs) == len(f.losses) <= 40
    assert f._repr_svg_().startswith("<svg")


def test_bad_data_and_arguments_raise_value_error():
    x, y = blobs()
    with pytest.raises(ValueError, match=r"data must be \(x, y\)"):
        mixtrain.doctor(Mlp(), x)
    with pytest.raises(ValueError, match="x\\[1\\] is a str, not a tensor"):
        mixtrain.train(Mlp(), ([x, "mask"], y), **FAST)
    with pytest.raises(ValueError, match="x has 1024 samples but y has 100"):
        mixtrain.train(Mlp(), (x, y[:100]), **FAST)
    with pytest.raises(ValueError, match="the model does not run on the data"):
        mixtrain.train(Mlp(), (x[:, :10], y), **FAST)
    with pytest.raises(ValueError, match="bs=0"):
        mixtrain.train(Mlp(), (x, y), bs=0)
    with pytest.raises(ValueError, match="invalid growth_factor=1"):
        mixtrain.train(Mlp(), (x, y), precision="fp16", growth_factor=1, **FAST)
    with pytest.raises(ValueError, match="invalid epochs='3'"):
        mixtrain.train(Mlp(), (x, y), epochs="3")
    with pytest.raises(ValueError, match="keep_fp32"):
        mixtrain.train(Mlp(), (x, y), precision="fp16", keep_fp32=["nothere"], **FAST)
    with pytest.raises(TypeError, match="unexpected keyword argument 'epoch'"):
        mixtrain.train(Mlp(), (x, y), epoch=3)
    with pytest.raises(ValueError, match="model must be a torch.nn.Module"):
        mixtrain.doctor(lambda t: t, (x, y))


def test_keywords_take_numpy_numbers_and_lists_of_split_points():
    np = pytest.importorskip("numpy")
    x, y = blobs(256)
    r = mixtrain.train(Mlp(), (x, y), epochs=1, bs=np.int64(32), lr=np.float32(1e-2), threads=np.int32(1))
    assert len(r.epochs) == 1
    r = mixtrain.train(Mlp(), (x, y), epochs=1, split_at=["head"], lr=[1e-3, 1e-2], bs=32, threads=1)
    assert len(r.epochs) == 1
    with pytest.raises(ValueError, match=r"invalid bs=32.5: an integer"):
        mixtrain.train(Mlp(), (x, y), bs=np.float64(32.5))
    with pytest.raises(ValueError, match=r"invalid split_at=\[1.5\]: a name, or a list of names"):
        mixtrain.train(Mlp(), (x, y), split_at=[1.5])


def test_data_as_users_hold_it_dataloader_dataset_numpy(capfd):
    np = pytest.importorskip("numpy")
    from torch.utils.data import DataLoader, TensorDataset
    x, y = blobs(512)
    # A shuffling DataLoader, read once under the seed: the same samples on every call.
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    model = Mlp()
    twin = copy.deepcopy(model)
    first = mixtrain.train(model, loader, epochs=1, **FAST)
    torch.manual_seed(123)  # the caller's generator state does not change what is read
    again = mixtrain.train(twin, loader, epochs=1, **FAST)
    untimed = lambda epochs: [{k: v for k, v in e.items() if k not in ("time", "seconds")} for e in epochs]
    assert untimed(first.epochs) == untimed(again.epochs)
    out = capfd.readouterr().out
    assert "mixtrain: notice: data: 512 samples from the first 8 batches of the DataLoader, read once under seed=" in out
    # A map-style Dataset: at most max_samples, drawn once in a seeded order, and said.
    r = mixtrain.train(Mlp(), TensorDataset(x, y), max_samples=300, epochs=1, **FAST)
    assert r.summary["train_samples"] == 240
    assert "300 of the Dataset's 512 samples, drawn once in an order seeded by seed=" in capfd.readouterr().out
    # Numpy arrays, and int32 targets.
    r = mixtrain.train(Mlp(), (x.numpy(), y.numpy().astype(np.int32)), epochs=1, **FAST)
    assert len(r.epochs) == 1
    # The doctor on a DataLoader: both runs see the same samples (one draw).
    d = mixtrain.doctor(Mlp(), loader, epochs=2, **FAST)
    assert d.verdict == "healthy", d.report
    with pytest.raises(ValueError, match="item 0 is a str, not an \\(x, y\\) pair"):
        mixtrain.train(Mlp(), ["ab", "cd"], **FAST)


def test_validation_data_is_checked_before_anything_trains():
    x, y = blobs()
    model = Mlp()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="the model does not run on the validation data"):
        mixtrain.train(model, (x, y), valid=(x[:, :10], y), epochs=1, **FAST)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the model is untouched


def test_what_libtorch_would_raise_deep_inside_is_one_line_first():
    x, y = blobs(256)
    frozen = Mlp()
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="every parameter of the model is frozen"):
        mixtrain.train(frozen, (x, y), **FAST)
    with pytest.raises(ValueError, match="on the meta device"):
        mixtrain.train(Mlp().to("meta"), (x, y), **FAST)
    with pytest.raises(ValueError, match="float64: .* pass model.float\\(\\)"):
        mixtrain.train(Mlp().double(), (x, y), **FAST)
    with pytest.raises(TypeError, match="the model's forward takes batch: Dict\\[str, Tensor\\]"):
        mixtrain.train(TakesDict(), (x, y), **FAST)
    with pytest.raises(TypeError, match="the model's forward calls Python \\(Doubled"):
        mixtrain.train(CallsAutogradFunction(), (x, y), **FAST)
    with pytest.raises(ValueError, match="too few training steps to judge"):
        mixtrain.doctor(Mlp(), (x[:40], y[:40]), epochs=1, **FAST)
    with pytest.raises(ValueError, match="invalid num_it=2: must be >= 7"):
        mixtrain.lr_find(Mlp(), (x, y), num_it=2, bs=32, threads=1)
    with pytest.raises(ValueError, match="data has 1 sample: too few to keep 20% for validation; pass more, or valid="):
        mixtrain.train(Mlp(), (x[:1], y[:1]), bs=1)
    with pytest.raises(ValueError, match="the inputs are uint8: convert them to float"):
        mixtrain.train(Mlp(), ((x * 10).clamp(0, 255).to(torch.uint8), y), **FAST)
    with pytest.raises(ValueError, match="the inputs are int64 integers: if they are features rather than token ids, "
                                         "convert them to float"):
        mixtrain.train(Mlp(), ((x * 10).clamp(0, 255).long(), y), **FAST)


def test_a_second_train_into_the_same_out_is_refused_and_a_stop_without_out_names_no_file(tmp_path):
    x, y = blobs(256)
    mixtrain.train(Mlp(), (x, y), epochs=1, out=tmp_path / "run", **FAST)
    with pytest.raises(ValueError, match="holds a finished run; name another folder, or pass force=True to start over"):
        mixtrain.train(Mlp(), (x, y), epochs=1, out=tmp_path / "run", **FAST)
    mixtrain.train(Mlp(), (x, y), epochs=1, out=tmp_path / "run", force=True, **FAST)
    bad = x.clone()
    bad[:, 0] = float("nan")
    with pytest.warns(mixtrain.MixtrainWarning) as caught:  # a RuntimeWarning
        r = mixtrain.train(Mlp(), (bad, y), epochs=1, **FAST)
    assert r.stopped and "held by the returned model" in r.stopped and "checkpoint-" not in r.stopped, r.stopped
    said = [str(w.message) for w in caught]
    assert len(said) == 3, said  # each split's inputs, then the stop
    assert "the training inputs hold" in said[0] and "the validation inputs hold" in said[1], said
    assert said[2].startswith("mixtrain.train stopped: "), said


def test_a_model_returning_a_dict_trains_on_its_logits(capfd):
    r = mixtrain.train(DictOut(), blobs(), precision="fp16", epochs=3, **FAST)
    assert r.epochs[-1]["accuracy"] > 0.8
    said = capfd.readouterr()
    assert "training on its 'logits'" in said.err
    assert "valid accuracy" in said.out and "written" not in said.out  # no file named that is gone


def test_a_model_scripting_rejects_is_traced_and_says_so():
    d = mixtrain.doctor(Unscriptable(), blobs(), **FAST)
    assert d.model_source.startswith("traced on the first batch (torch.jit.script failed:")
    assert d.verdict == "healthy", d.report


def test_the_keywords_are_the_option_tables():
    import inspect
    params = inspect.signature(mixtrain.train).parameters
    assert params["epochs"].default == 1 and params["precision"].default == "fp32"
    assert params["init_scale"].default == 65536.0 and params["keep_fp32"].default is None
    assert "max_trials" in inspect.signature(mixtrain.doctor).parameters
    assert "max_trials" not in params and "resume" not in params
    assert inspect.signature(mixtrain.doctor).parameters["precision"].default == "fp16"
    assert "growth_factor:" in mixtrain.train.__doc__


def test_ctrl_c_raises_keyboard_interrupt_and_the_gil_is_free_while_training():
    model = Mlp()
    ticks = []
    stop = threading.Event()

    def tick():  # runs only if training released the GIL
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    ticker = threading.Thread(target=tick)
    ticker.start()
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            mixtrain.train(model, blobs(4096), precision="fp16", epochs=200, **FAST)
    finally:
        stop.set()
        ticker.join()
        timer.cancel()
    assert time.monotonic() - started < 30
    assert len([t for t in ticks if t > started + 0.2]) > 20
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's handler is back


def test_the_doctor_runs_on_a_torchvision_model(tmp_path):
    # torchvision does not import beside torch 2.13's CPU build: its resnet18 is scripted
    # in .venv-cuda (torch 2.14.1 + torchvision 0.29.1) and loaded here, as a user with
    # a model file from another environment would.
    python = os.environ.get("MIXTRAIN_TORCHVISION_PYTHON")
    if not python:
        pytest.skip("no .venv-cuda (scripts/setup.sh --cuda) when the build was configured")
    path = str(tmp_path / "resnet18.pt")
    code = ("import sys, torch, torchvision; torch.manual_seed(0); "
            "torch.jit.script(torchvision.models.resnet18(num_classes=3)).save(sys.argv[1])")
    assert subprocess.run([python, "-c", code, path]).returncode == 0
    model = torch.jit.load(path)
    g = torch.Generator().manual_seed(0)
    y = torch.arange(160) % 3
    x = torch.randn(160, 3, 32, 32, generator=g) * 0.5
    x[torch.arange(160), y] += 1.0  # the class is the brighter channel
    d = mixtrain.doctor(model, (x, y), bs=16, lr=1e-3, epochs=2, threads=2, max_trials=1)
    assert d.model_source == "a ScriptModule, used as it is"
    assert d.verdict == "healthy", d.report
    assert d.measurements["fp32"]["accuracy"] > 0.6, d.report


def test_a_bf16_model_is_trained_bf16_pure_and_given_back_in_bf16(capfd):
    model = Mlp().to(torch.bfloat16)
    r = mixtrain.train(model, blobs(), epochs=2, weight_update="stochastic", **FAST)
    assert r.summary["precision"] == "bf16-pure"
    assert r.summary["lost_updates"]["weight_update"] == "stochastic"
    assert r.summary["bytes_per_param"]["weights"] == 2
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert "the model's parameters are bf16: training it as bf16-pure" in capfd.readouterr().out
    x, _ = blobs(64)
    assert model(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_an_fp16_model_is_a_one_line_value_error():
    with pytest.raises(ValueError, match="the model's parameters are fp16"):
        mixtrain.train(Mlp().half(), blobs(), **FAST)


# ---- [Crashes]: real CPU bf16, threads, signals, what is handed back ----------


class NormedMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(20, 32)
        self.ln1 = nn.LayerNorm(32)
        self.l2 = nn.Linear(32, 3)

    def forward(self, x):
        return self.l2(torch.relu(self.ln1(self.l1(x))))


@pytest.fixture
def real_bf16(monkeypatch):
    """bf16 as a CPU with bf16 units runs it: libtorch's real CPU autocast (the same
    path on any CPU, only slower without the units)."""
    monkeypatch.setenv("MIXTRAIN_CPU_BF16", "1")


def test_an_island_fed_a_bf16_activation_trains_under_real_cpu_bf16(real_bf16):
    for precision in ("bf16", "bf16-pure"):
        r = mixtrain.train(NormedMlp(), blobs(), precision=precision, keep_fp32=["ln1"], epochs=1, **FAST)
        assert r.summary["emulated"] is False
        assert r.valid["valid_loss"] == r.valid["valid_loss"]  # finite, not NaN


def test_two_threads_train_at_once_and_get_what_each_would_alone(real_bf16):
    jobs = [("bf16", 0), ("bf16-pure", 1), ("bf16", 2), ("bf16-pure", 3)]
    torch.manual_seed(0)
    models = [Mlp() for _ in jobs]
    alone = [copy.deepcopy(m) for m in models]
    results, errors = {}, []

    def run(i):
        precision, seed = jobs[i]
        try:
            results[i] = mixtrain.train(models[i], blobs(), precision=precision, seed=seed, epochs=2, **FAST)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, (precision, seed) in enumerate(jobs):
        r = mixtrain.train(alone[i], blobs(), precision=precision, seed=seed, epochs=2, **FAST)
        assert results[i].valid == r.valid, (precision, seed)
        for a, b in zip(models[i].parameters(), alone[i].parameters()):
            assert torch.equal(a, b)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, TimeoutError])
def test_what_a_signal_handler_raises_stops_the_fit_between_batches(raised):
    def on_alarm(signum, frame):
        raise raised("alarm")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    started = time.monotonic()
    try:
        with pytest.raises(raised):
            mixtrain.train(Mlp(), blobs(4096), precision="fp16", epochs=200, **FAST)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 30  # not after the 200 epochs


def test_a_bf16_model_trained_as_fp32_weights_comes_back_in_fp32_as_valid_measured_it(capfd):
    x, y = blobs()
    vx, vy = blobs(256, seed=1)
    for precision in ("fp32", "bf16-master"):
        model = Mlp().to(torch.bfloat16)
        r = mixtrain.train(model, (x, y), valid=(vx, vy), precision=precision, epochs=2, **FAST)
        assert all(p.dtype == torch.float32 for p in model.parameters()), precision
        with torch.no_grad():
            accuracy = (model(vx).argmax(1) == vy).float().mean().item()
        assert r.valid["accuracy"] == accuracy, precision
        assert "came in bf16 and trained as fp32 weights (precision=%r): they are handed back in fp32" % precision in \
            capfd.readouterr().out


def test_an_fp32_model_under_bf16_pure_holds_bf16_values_and_says_so(capfd):
    model = Mlp()
    mixtrain.train(model, blobs(), precision="bf16-pure", epochs=1, **FAST)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(p, p.to(torch.bfloat16).float()) for p in model.parameters())
    assert "the model's fp32 parameters now hold bfloat16 values" in capfd.readouterr().out


def test_meta_sparse_and_empty_data_are_one_line_value_errors():
    x, y = blobs()
    with pytest.raises(ValueError, match=r"data: x\[0\] is on the meta device"):
        mixtrain.train(Mlp(), (x.to("meta"), y), **FAST)
    with pytest.raises(ValueError, match=r"data: x\[0\] is a sparse_coo tensor: pass x\[0\].to_dense\(\)"):
        mixtrain.train(Mlp(), (x.to_sparse(), y), **FAST)
    with pytest.raises(ValueError, match="valid holds no samples"):
        mixtrain.train(Mlp(), (x, y), valid=(x[:0], y[:0]), **FAST)


def test_train_leaves_the_callers_random_state_and_says_when_it_traced(capfd):
    model, data = Unscriptable(), blobs()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    r = mixtrain.train(model, data, epochs=1, seed=7, **FAST)
    assert torch.equal(torch.rand(3), expected)  # the run seeded torch's generator with 7, then gave it back
    assert r.summary["model_source"].startswith("traced on the first batch (torch.jit.script failed:")
    assert "mixtrain: notice: the model was traced on the first batch" in capfd.readouterr().out


# ---- The doctor from where the user's own loop stands (optimizer=, scaler=, steps=) ----

def _loop(make_optimizer, steps_before=20, bs=32, dtype=torch.float32):
    """A model trained `steps_before` steps in a plain torch loop, its optimizer, and the batches."""
    torch.manual_seed(0)
    x, y = blobs(2048)
    model = Mlp().to(dtype)
    opt = make_optimizer(model.parameters())
    batches = [(x[i:i + bs], y[i:i + bs]) for i in range(0, len(x), bs)]
    for xb, yb in batches[:steps_before]:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb.to(dtype)).float(), yb).backward()
        opt.step()
    return model, opt, batches


def _continued(model, opt, make_optimizer, batches):
    """The user's loop continued on copies of the model and optimizer over `batches`: the
    copy and its per-step losses (what the doctor's fp32 arm must equal)."""
    twin = copy.deepcopy(model)
    twin_opt = make_optimizer(twin.parameters())
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict would share the tensors
    losses = []
    for xb, yb in batches:
        twin_opt.zero_grad()
        loss = nn.functional.cross_entropy(twin(xb), yb)
        loss.backward()
        twin_opt.step()
        losses.append(loss.item())
    return twin, losses


@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.05),
    lambda p: torch.optim.Adam(p, lr=1e-3, betas=(0.8, 0.99), weight_decay=1e-4, amsgrad=True),
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    lambda p: torch.optim.RMSprop(p, lr=1e-3, alpha=0.9, momentum=0.5, centered=True),
    lambda p: torch.optim.Adagrad(p, lr=1e-2, lr_decay=1e-3, initial_accumulator_value=0.1),
    lambda p: mixtrain.optim.AdamW(p, lr=1e-3, weight_decay=0.05, weight_update="stochastic"),
], ids=["adamw", "adam-amsgrad", "sgd-nesterov", "rmsprop-centered", "adagrad", "mixtrain-adamw"])
def test_the_fp32_window_is_the_users_own_loop_continued(make_optimizer):
    model, opt, batches = _loop(make_optimizer)
    # The user's loop, continued on copies for the window's 16 batches, on the doctor's 2 threads.
    # With a correctly rounded root, as the optimizer core takes it (tests/python/correct_root.py).
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with correctly_rounded_root():
            twin, losses = _continued(model, opt, make_optimizer, batches[20:36])
    finally:
        torch.set_num_threads(threads)
    window_x = torch.cat([b[0] for b in batches[20:36]])
    window_y = torch.cat([b[1] for b in batches[20:36]])
    with torch.no_grad():
        valid_loss = nn.functional.cross_entropy(twin(window_x), window_y).item()
    before = [p.detach().clone() for p in model.parameters()]
    d = mixtrain.doctor(model, iter(batches[20:]), optimizer=opt, steps=16, precision="bf16", threads=2)
    fp32 = d.measurements["fp32"]
    assert fp32["steps"] == 16
    # Bitwise: the arm replays the loop's update (mixtrain's optimizer core: torch.optim's arithmetic
    # with a correctly rounded root) on the loop's threads (2, as the twin ran). (libtorch's own AdamW, its first moment as mul_/add_, gives
    # the same losses here too: the exactness is of the replay, not a test of lerp_.)
    assert fp32["final_loss"] == sum(losses[-5:]) / 5
    assert fp32["valid_loss"] == pytest.approx(valid_loss, rel=1e-5)
    replay = d.to_dict()["replay"]
    assert replay["step"] == (None if isinstance(opt, torch.optim.SGD) else 20)  # SGD counts no steps
    assert replay["window"] == 16 and replay["matches_run"] is None
    assert "training loop" in d.report
    # The doctor worked on copies: the user's model and optimizer are as they were.
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(opt.state) == len(before)


def test_a_bf16_model_with_its_adamw_is_the_pure_bf16_case(capfd):
    model, opt, batches = _loop(lambda p: torch.optim.AdamW(p, lr=1e-4), dtype=torch.bfloat16)
    d = mixtrain.doctor(model, iter(batches[20:]), optimizer=opt, steps=16, threads=2, no_trials=True)
    assert d.measurements["mixed"]["precision"] == "bf16-pure"
    assert "lost_updates" in d.measurements["mixed"]
    assert "diagnosing it as bf16-pure" in capfd.readouterr().out
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # given back as it came


def _without_times(d):
    """A diagnosis as JSON without its wall-clock times."""
    if isinstance(d, dict):
        return {k: _without_times(v) for k, v in d.items()
                if k not in ("seconds", "timing") and not k.endswith("_seconds")}
    if isinstance(d, list):
        return [_without_times(v) for v in d]
    return d


def test_a_loops_two_arms_replay_beside_each_other_and_two_doctors_agree_bitwise(capfd):
    # A bf16 loop from its start at a small lr: lost_updates, and its first trial (stochastic
    # rounding) runs, so the trial's numbers are compared too.
    model, opt, batches = _loop(lambda p: torch.optim.AdamW(p, lr=1e-4), dtype=torch.bfloat16, steps_before=0)
    first = mixtrain.doctor(model, iter(batches), optimizer=opt, steps=48, threads=2, max_trials=1)
    out = capfd.readouterr().out
    assert "the fp32 arm replays beside the bf16-pure run, 1 thread(s) each" in out
    timing = first.to_dict()["timing"]
    assert set(timing) == {"setup", "pair", "after", "trials"}  # the arms as one phase: side by side
    assert first.verdict == "lost_updates" and len(first.to_dict()["trials"]) == 1
    second = mixtrain.doctor(model, iter(batches), optimizer=opt, steps=48, threads=2, max_trials=1)
    assert _without_times(second.to_dict()) == _without_times(first.to_dict())
    # On one thread there is no pair: the arms replay in turn, each its own phase.
    single = mixtrain.doctor(model, iter(batches), optimizer=opt, steps=48, threads=1, no_trials=True)
    assert {"fp32", "run"} <= set(single.to_dict()["timing"])
    # Nor for a model that draws random numbers as it trains (dropout): in turn, each arm built once.
    capfd.readouterr()
    torch.manual_seed(0)
    dropping = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3)).to(torch.bfloat16)
    x, y = blobs(2048)
    drop_opt = torch.optim.AdamW(dropping.parameters(), lr=1e-4)
    drawn = mixtrain.doctor(dropping, iter([(x[i:i + 32], y[i:i + 32]) for i in range(0, 1536, 32)]),
                            optimizer=drop_opt, steps=48, threads=2, no_trials=True)
    out = capfd.readouterr().out
    assert "beside" not in out and out.count("doctor: 1/2 fp32 from the loop's state") == 1, out
    assert {"fp32", "run"} <= set(drawn.to_dict()["timing"])


def test_a_grad_scalers_scale_and_settings_start_the_fp16_arm():
    model, opt, batches = _loop(lambda p: torch.optim.AdamW(p, lr=1e-3), steps_before=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=4)
    for xb, yb in batches[:10]:
        opt.zero_grad()
        scaler.scale(nn.functional.cross_entropy(model(xb), yb)).backward()
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 4096.0  # grew twice
    d = mixtrain.doctor(model, iter(batches[10:]), optimizer=opt, scaler=scaler, steps=16, threads=2, no_trials=True)
    scale = d.measurements["mixed"]["scale_history"]
    assert d.measurements["mixed"]["precision"] == "fp16"
    assert scale["initial_scale"] == 4096.0
    # growth_interval 4 from the branch point (the scaler's own count of clean steps is not carried):
    # 4 steps at each of 4096, 8192, 16384 and 32768.
    assert scale["max_scale"] == 4096.0 * 2 ** 3 and scale["backoffs"] == 0


def test_a_training_loops_state_that_does_not_fit_is_a_one_line_value_error():
    model, opt, batches = _loop(lambda p: torch.optim.AdamW(p, lr=1e-3), steps_before=2)
    other = torch.optim.AdamW(Mlp().parameters(), lr=1e-3)
    cases = [
        (dict(optimizer=other, steps=16), "not a parameter of the model"),
        (dict(optimizer=torch.optim.Adamax(model.parameters()), steps=16), "torch.optim.AdamW, Adam, SGD, RMSprop or Adagrad"),
        (dict(optimizer=opt, steps=4), "invalid steps=4: an integer >= %d" % mixtrain._native.MIN_COMPARE_STEPS),
        (dict(optimizer=opt), "optimizer= and steps="),
        (dict(optimizer=opt, steps=16, lr=1e-2), "lr= comes from the training loop"),
        (dict(optimizer=torch.optim.AdamW(list(model.parameters())[:2], lr=1e-3), steps=16), "is not in the optimizer"),
        (dict(optimizer=torch.optim.AdamW([{"params": list(model.parameters())[:2], "lr": 1e-3},
                                           {"params": list(model.parameters())[2:], "lr": 1e-4}]), steps=16),
         "different learning rates"),
        (dict(optimizer=opt, steps=200), "too few for steps=200"),
        (dict(optimizer=opt, steps=16, from_run="runs/x"), "one or the other"),
    ]
    for kwargs, expected in cases:
        with pytest.raises(ValueError) as e:
            mixtrain.doctor(model, iter(batches), **kwargs)
        assert expected in str(e.value) and "\n" not in str(e.value), (kwargs, str(e.value))
    uneven = [batches[0], (batches[1][0][:7], batches[1][1][:7])] + batches[2:20]
    with pytest.raises(ValueError, match="batches hold different numbers of samples"):
        mixtrain.doctor(model, uneven, optimizer=opt, steps=16)


def test_the_doctor_branches_a_run_folder_from_python(tmp_path):
    x, y = blobs(2048)
    run = tmp_path / "run"
    mixtrain.train(Mlp(), (x, y), out=run, precision="fp16", epochs=2, save_every_steps=10, threads=2, bs=64)
    d = mixtrain.doctor(Mlp(), (x, y), from_run=run, at=20, window=10, out=tmp_path / "doc", no_trials=True)
    replay = d.to_dict()["replay"]
    assert replay["step"] == 20 and replay["window"] == 10
    assert replay["matches_run"] is True, d.report
    with pytest.raises(ValueError, match="handed over in memory"):
        mixtrain.doctor(from_run=run)
    with pytest.raises(ValueError, match="model and data together"):
        mixtrain.doctor(Mlp(), from_run=run)
    with pytest.raises(ValueError, match="has no checkpoint at step 7"):
        mixtrain.doctor(Mlp(), (x, y), from_run=run, at=7)
    with pytest.raises(ValueError, match="at= and window= pick what from_run= replays"):
        mixtrain.doctor(Mlp(), (x, y), at=7)
    # A keyword is refused with from_run= even at its default value (fp16 is the doctor's default).
    for given in (dict(precision="fp16"), dict(precision="bf16"), dict(lr=3e-3), dict(seed=42)):
        with pytest.raises(ValueError, match="replays the run with its own flags .*drop %s$" % list(given)[0]):
            mixtrain.doctor(Mlp(), (x, y), from_run=run, at=20, out=tmp_path / "refused", **given)
    # The doctor's out= may not be a run's folder, however the path is spelled.
    with pytest.raises(ValueError, match="holds a run"):
        mixtrain.doctor(Mlp(), (x, y), from_run=run, at=20, window=10, out=str(run) + "/q/..", no_trials=True)


def test_no_spelling_of_a_runs_folder_lets_a_new_run_take_it(tmp_path):
    x, y = blobs(256)
    run = tmp_path / "old"
    mixtrain.train(Mlp(), (x, y), epochs=1, out=run, save_every=1, **FAST)
    kept = sorted(os.listdir(run))
    for spelled in (str(run) + "/q/..", str(run) + "/", str(run) + "/./q/r/../.."):
        with pytest.raises(ValueError, match="holds a finished run"):
            mixtrain.train(Mlp(), (x, y), epochs=1, out=spelled, **FAST)
    assert sorted(os.listdir(run)) == kept


def test_the_package_says_its_version_and_the_torch_it_was_built_for():
    assert mixtrain.__version__.startswith("0."), mixtrain.__version__
    assert "+torch" + torch.__version__.split("+")[0] in mixtrain.__version__, mixtrain.__version__


def test_a_runs_warnings_are_mixtrain_warnings_in_pythons_words():
    model = Mlp().to(torch.bfloat16)
    with pytest.warns(mixtrain.MixtrainWarning) as caught:
        mixtrain.train(model, blobs(), epochs=1, bs=32, lr=1e-5, threads=1)
    lines = [str(w.message) for w in caught]
    # 99.8% lost under nearest rounding: the watch's lost_updates verdict, in Python's words.
    said = next(line for line in lines if line.startswith("lost_updates: "))
    assert 'weight_update="stochastic"' in said and "`mixtrain.doctor()` proves it" in said, said
    assert "--weight-update" not in said and "likely" not in said, said
    assert caught[0].filename == __file__  # pointed at the caller's line
    # 35% lost at lr 3e-3: below the verdict's 75%, still a fact worth a line, with the doctor that judges it.
    torch.manual_seed(0)
    with pytest.warns(mixtrain.MixtrainWarning) as caught:
        mixtrain.train(Mlp().to(torch.bfloat16), blobs(), epochs=1, bs=32, lr=3e-3, threads=1)
    said = next(str(w.message) for w in caught if "rounded away in bf16" in str(w.message))
    assert not said.startswith("lost_updates"), said
    assert 'weight_update="stochastic"' in said and "`mixtrain.doctor()` tells" in said, said
    with warnings.catch_warnings():
        warnings.simplefilter("error", mixtrain.MixtrainWarning)
        with pytest.raises(mixtrain.MixtrainWarning):
            mixtrain.train(Mlp().to(torch.bfloat16), blobs(), epochs=1, bs=32, lr=1e-5, threads=1)


def test_the_doctors_report_is_said_once_by_what_it_returns(capfd):
    d = mixtrain.doctor(Mlp(), blobs(), **FAST)
    out = capfd.readouterr().out
    assert "verdict: healthy" in d.report and "verdict:" not in out, out
    assert str(d) == d.report


class HfShapedMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(20, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.l1(x))))


def test_a_bf16_model_with_norms_kept_in_fp32_is_bf16_pure_with_islands(capfd):
    """Hugging Face's _keep_in_fp32_modules shape: bf16 weights, the norm in fp32."""
    model = HfShapedMlp().to(torch.bfloat16)
    model.norm.float()
    r = mixtrain.train(model, blobs(), epochs=1, **FAST)
    out = capfd.readouterr().out
    assert "bf16 except 1 module kept in fp32 (norm)" in out and 'keep_fp32=["norm"]' in out, out
    assert out.count("kept in fp32") == 1  # said once
    assert r.summary["precision"] == "bf16-pure", r.summary
    assert model.norm.weight.dtype == torch.float32 and model.l1.weight.dtype == torch.bfloat16  # as it came
    d = mixtrain.doctor(model, blobs(), no_trials=True, **FAST)
    assert d.measurements["mixed"]["precision"] == "bf16-pure"
    assert model.norm.weight.dtype == torch.float32 and model.head.weight.dtype == torch.bfloat16


def test_the_optimizer_is_a_keyword_with_fastais_knobs():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixtrain.MixtrainWarning)  # the lost-updates fact, tested elsewhere
        r = mixtrain.train(Mlp(), blobs(), opt="sgd", mom=0.9, precision="bf16-pure", epochs=1, **FAST)
    assert r.summary["bytes_per_param"]["optimizer_state"] == 2  # one bf16 momentum buffer
    d = mixtrain.doctor(Mlp(), blobs(), opt="adam", wd=0.0, no_trials=True, **FAST)
    assert d.verdict in ("healthy", "underflow", "gradient_overflow", "forward_overflow"), d.report
    with pytest.raises(ValueError, match=r"unknown opt 'lion' \(choices: adamw, adam, sgd, rmsprop, adagrad\)"):
        mixtrain.train(Mlp(), blobs(), opt="lion", **FAST)


@pytest.mark.parametrize("change", ["torch.__version__ = '2.99.0+cpu'", "torch._C._GLIBCXX_USE_CXX11_ABI = not torch._C._GLIBCXX_USE_CXX11_ABI",
                                    "torch.version.cuda = '99.0' if torch.version.cuda is None else None"],
                         ids=["version", "abi", "cuda"])
def test_a_torch_other_than_the_one_built_against_is_a_one_line_import_error(change):
    code = "import sys, torch\n%s\ntry:\n    import mixtrain\nexcept ImportError as e:\n    print(str(e)); sys.exit(3)\n" % change
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(mixtrain.__file__)))  # the cwd may be a tmp dir
    env = dict(os.environ, PYTHONPATH=package_dir)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 3, (r.stdout, r.stderr)
    line = r.stdout.strip()
    assert "\n" not in line and line.startswith("mixtrain was built against torch ") and "rebuild it against this torch" in line, line
    assert "this Python imports torch" in line and sys.executable in line, line


class WithBuffers(Mlp):
    """An Mlp with a floating buffer of its own dtype: a scale kept in fp32 in a bf16 model."""

    def __init__(self, buffer_dtype):
        super().__init__()
        self.register_buffer("scale", torch.tensor([1.0 + 2 ** -12, 3.0], dtype=buffer_dtype))

    def forward(self, x):
        return self.head(self.body(x)) * self.scale[0].to(x.dtype)


def test_every_buffer_comes_back_with_its_dtype_and_value():
    # A bf16 model's fp32 buffer (its value is not a bf16 number: rounding would show).
    model = WithBuffers(torch.float32).to(torch.bfloat16)
    model.scale = model.scale.float()
    model.scale.copy_(torch.tensor([1.0 + 2 ** -12, 3.0]))
    before = model.scale.clone()
    mixtrain.doctor(model, blobs(512), epochs=1, no_trials=True, **FAST)
    assert model.scale.dtype == torch.float32 and torch.equal(model.scale, before)
    mixtrain.train(model, blobs(512), epochs=1, **FAST)
    assert model.scale.dtype == torch.float32 and torch.equal(model.scale, before)
    # Hugging Face's shape (bf16 weights, an fp32 island) with a bf16 buffer.
    hf = WithBuffers(torch.float32).to(torch.bfloat16)
    hf.head.float()  # the island; the buffer stays bf16
    value = hf.scale.clone()
    mixtrain.doctor(hf, blobs(512), epochs=1, no_trials=True, **FAST)
    assert hf.scale.dtype == torch.bfloat16 and torch.equal(hf.scale, value)
    assert hf.head.weight.dtype == torch.float32 and hf.body[0].weight.dtype == torch.bfloat16


class TracedWithNorm(nn.Module):
    """Scripting fails (*inputs), so mixtrain traces it: in train mode, with BatchNorm."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1))
        self.head = nn.Linear(32, 3)

    def forward(self, *inputs):
        return self.head(self.body(inputs[0]))


def test_tracing_leaves_the_callers_batchnorm_statistics_and_random_state_as_they_were():
    model = TracedWithNorm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    d = mixtrain.doctor(model, blobs(512), epochs=1, no_trials=True, **FAST)
    assert "traced" in d.model_source
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(torch.get_rng_state(), rng)
    mixtrain.lr_find(model, blobs(512), num_it=20, bs=32, threads=1)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_a_loops_window_says_what_it_used_and_leaves_the_callers_random_state(capfd):
    model, opt, batches = _loop(lambda p: torch.optim.AdamW(p, lr=1e-3))
    x, y = blobs(2048)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)
    rng = torch.get_rng_state()
    state = copy.deepcopy(opt.state_dict())
    weights = copy.deepcopy(model.state_dict())
    mixtrain.doctor(model, loader, optimizer=opt, steps=16, precision="bf16", threads=1, no_trials=True)
    assert torch.equal(torch.get_rng_state(), rng), "the shuffle moved the caller's generator"
    # The caller's optimizer state and weights, bit for bit as they were.
    after = opt.state_dict()
    assert after["param_groups"] == state["param_groups"]
    for i, s in state["state"].items():
        for key, value in s.items():
            assert torch.equal(after["state"][i][key], value), (i, key)
    for key, value in weights.items():
        assert torch.equal(model.state_dict()[key], value) and model.state_dict()[key].dtype == value.dtype, key
    it = iter(batches[20:])
    d = mixtrain.doctor(model, it, optimizer=opt, steps=16, precision="bf16", threads=1, no_trials=True)
    out = capfd.readouterr().out
    assert "read the next 16 batches of your data iterator" in out, out
    assert "optimizer step 20" in out, out
    assert len(list(it)) == len(batches) - 20 - 16
    # (x, y) tensors take the loop's batch size.
    d = mixtrain.doctor(model, (x, y), optimizer=opt, steps=16, bs=64, precision="bf16", threads=1, no_trials=True)
    assert d.measurements["fp32"]["steps"] == 16
    assert d.to_dict()["replay"]["window"] == 16
    mixtrain.doctor(model, (x, y), optimizer=opt, steps=8, precision="bf16", threads=1, no_trials=True)
    assert "batches of bs=256 (the default)" in capfd.readouterr().out


def test_trains_last_line_goes_through_sys_stdout():
    import contextlib
    import io
    caught = io.StringIO()
    with contextlib.redirect_stdout(caught):
        mixtrain.train(Mlp(), blobs(512), epochs=1, **FAST)
    assert "valid accuracy" in caught.getvalue(), caught.getvalue()


def test_a_list_of_samples_is_data():
    x, y = blobs(512)
    samples = [(x[i], y[i]) for i in range(len(y))]
    r = mixtrain.train(Mlp(), samples, epochs=1, **FAST)
    assert r.summary["train_samples"] == 410  # 512 samples, a seeded 20% kept for validation
    numbers = [(x[i], int(y[i])) for i in range(len(y))]  # y as Python numbers, as a Dataset's items often are
    assert mixtrain.train(Mlp(), numbers, epochs=1, **FAST).summary["train_samples"] == 410


class TiedLm(nn.Module):
    """A language model's shape: the output head shares the embedding's weight."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(torch.tanh(self.mix(self.emb(x))))


def tokens(n=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 16, (n,), generator=g)
    return x, (x * 3 + 1) % 16


def test_tied_weights_train_stay_tied_and_are_stepped_once():
    model = TiedLm()
    r = mixtrain.train(model, tokens(), epochs=2, **FAST)
    assert r.valid["accuracy"] > 0.5, r.valid
    assert model.head.weight is model.emb.weight  # the caller's tie is kept
    # The doctor from a plain loop's state: its fp32 arm is the user's loop continued, the
    # tied weight stepped once per step, not once per module that holds it.
    torch.manual_seed(0)
    model = TiedLm()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = tokens()
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, len(x), 32)]
    for xb, yb in batches[:10]:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    twin, losses = _continued(model, opt, lambda p: torch.optim.AdamW(p, lr=1e-2), batches[10:26])
    assert twin.head.weight is twin.emb.weight
    d = mixtrain.doctor(model, iter(batches[10:]), optimizer=opt, steps=16, precision="bf16", threads=1, no_trials=True)
    assert d.measurements["fp32"]["final_loss"] == pytest.approx(sum(losses[-5:]) / 5, rel=1e-5)
    assert model.head.weight is model.emb.weight
