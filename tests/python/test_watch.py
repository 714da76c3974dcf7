"""mixtrain.watch in plain PyTorch loops, written as a user would: an fp16 loop whose activation
drifts to overflow (forward_overflow at that module, before the first NaN), a loop whose loss
scale collapses (gradient_overflow, with the history), a bf16 model under torch's AdamW at a
small lr (lost_updates, close to mixtrain's exact count, LayerNorm gains among the worst), healthy
fp16 and bf16 loops (healthy, no warning), the same weights watched or not, and its bad input."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn

import mixtrain
from mixtrain import optim


class Drifting(nn.Module):
    """A projection whose weights we grow a little each step, as activations drift in a long
    fp16 run, then a LayerNorm (autocast runs it in fp32) and a head."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.norm(self.proj(x)))


class NormMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.norm = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return x, (x[:, :4] @ torch.randn(4, 4, generator=torch.Generator().manual_seed(9))).argmax(1)


def fp16_loop(model, opt, scaler, x, y, steps, drift=None, watch=None, bs=32):
    """torch's own fp16 recipe on the CPU: autocast + GradScaler. Returns the first step whose loss
    was not finite (or None)."""
    first_nan = None
    for i in range(steps):
        xb, yb = x[i * bs % len(x):][:bs], y[i * bs % len(x):][:bs]
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(xb).float(), yb)
        if watch is not None:
            watch.loss(loss)
        if first_nan is None and not torch.isfinite(loss):
            first_nan = i
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if drift is not None:
            with torch.no_grad():
                drift()
    return first_nan


def test_an_activation_drifting_to_fp16s_max_is_forward_overflow_at_its_module_before_the_first_nan():
    torch.manual_seed(0)
    model = Drifting()
    x, y = data(512, 1)
    x = x * 20
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mixtrain.watch(model, opt, scaler, every=5) as w:
            first_nan = fp16_loop(model, opt, scaler, x, y, 80, drift=lambda: model.proj.weight.mul_(1.15), watch=w)
    assert first_nan is not None  # unwatched, it ends in NaN
    report = w.report()
    assert report.verdict == "forward_overflow", report
    assert "module proj's output" in report.evidence[0], report
    crossed = w.to_dict()["module_ranges"]
    onset = next(r["step"] for r in crossed if r["ranges"]["proj"] >= 65504 / 4)
    assert onset < first_nan  # seen while the range crossed, before the loss went NaN
    assert report.cure == ["islands = mixtrain.keep_fp32(model, ['proj'])  # once, before the loop"]
    assert report.doctor_call == "mixtrain.doctor(model, data, optimizer=opt, scaler=scaler, steps=50)"
    said = [str(c.message) for c in caught if issubclass(c.category, mixtrain.MixtrainWarning)]
    assert len(said) == 1 and said[0].startswith("mixtrain.watch: forward_overflow: module proj's output")


def test_a_torchscript_model_is_watched_through_its_ops_at_the_same_module_and_step():
    """A ScriptModule's submodules take no forward hooks (torch refuses them): the op tracer sees
    the ops each module's parameters feed, TorchScript's autocast casts included."""
    torch.manual_seed(0)
    eager = Drifting()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's own: TorchScript models exist
        model = torch.jit.script(copy.deepcopy(eager))
    x, y = data(512, 1)
    x = x * 20
    reports = []
    for m in (eager, model):
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with mixtrain.watch(m, opt, scaler, every=5) as w:
                fp16_loop(m, opt, scaler, x, y, 60, drift=lambda: m.proj.weight.mul_(1.15), watch=w)
        reports.append((w.report(), w.to_dict()["module_ranges"]))
    (eager_report, eager_ranges), (report, ranges) = reports
    assert report.verdict == "forward_overflow" and report.evidence[0] == eager_report.evidence[0], report
    assert [list(r["ranges"]) for r in ranges] == [["proj", "norm", "head"]] * len(ranges)  # forward order
    assert ranges[0]["ranges"]["proj"] == pytest.approx(eager_ranges[0]["ranges"]["proj"], rel=1e-3)


def test_a_collapsing_loss_scale_is_gradient_overflow_with_its_history():
    """A loss whose gradients are not finite at any scale: each step skips and halves the scale."""
    torch.manual_seed(0)
    model = Drifting()
    x, y = data(256, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mixtrain.watch(model, opt, scaler, every=10) as w:
            for i in range(40):
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.float16):
                    out = model(x[:32])
                    loss = nn.functional.cross_entropy(out.float(), y[:32]) + (out.float() * 1e38).sum() * 1e3
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
    report = w.report()
    assert report.verdict == "gradient_overflow", report
    assert report.evidence[0].startswith("the loss scale collapsed: repeated back-off from 6.554e+04 down to")
    raw = w.to_dict()
    assert len(raw["scales"]) == 40 and raw["scales"][0] == 32768.0 and raw["scales"][-1] < 1
    assert raw["skipped_steps"] == list(range(40))
    # Every overflowing step's gradients are checked (the first 8), and the sampled steps' too.
    assert [g["step"] for g in raw["nonfinite_gradients"]] == list(range(8)) + [10, 20, 30]
    assert "head.weight" in raw["nonfinite_gradients"][3]["params"]
    assert any(line.startswith("scaler.unscale_(opt); torch.nn.utils.clip_grad_norm_") for line in report.cure)
    chart = w.plot()  # the doctor's scale chart, every step marked skipped
    assert chart.startswith("<svg") and "skipped step (40)" in chart and chart._repr_svg_() == chart


def pretrained_norm_mlp():
    torch.manual_seed(0)
    model = NormMlp()
    x, y = data(1024, 3)
    pre = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for i in range(100):
        pre.zero_grad()
        nn.functional.cross_entropy(model(x[i * 32 % 1024:][:32]), y[i * 32 % 1024:][:32]).backward()
        pre.step()
    return model


def bf16_loop(model, opt, x, y, steps, watch=None):
    for i in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i * 32 % len(x):][:32].to(torch.bfloat16)).float(),
                                           y[i * 32 % len(x):][:32])
        if watch is not None:
            watch.loss(loss)
        loss.backward()
        opt.step()


def test_a_bf16_model_at_a_small_lr_is_lost_updates_close_to_mixtrains_exact_count():
    base = pretrained_norm_mlp()
    x, y = data(1024, 4)
    model = copy.deepcopy(base).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mixtrain.watch(model, opt, every=4) as w:
            bf16_loop(model, opt, x, y, 40, watch=w)
    report = w.report()
    assert report.verdict == "lost_updates", report
    assert "on 10 sampled steps" in report.evidence[0]
    assert "norm.weight" in report.evidence[1]  # the LayerNorm gain among the worst
    assert report.cure[0].startswith("opt = mixtrain.optim.from_torch(opt, weight_update='stochastic')")
    assert sum(issubclass(c.category, mixtrain.MixtrainWarning) for c in caught) == 1
    counts = w.to_dict()["lost_updates"]["per_param"]
    watched = sum(c["lost"] for c in counts.values()) / sum(c["intended"] for c in counts.values())

    # mixtrain's exact count (its own update pass, rounding to nearest) on the same model, data and lr.
    ours_model = copy.deepcopy(base).to(torch.bfloat16)
    ours = optim.AdamW(ours_model.parameters(), lr=1e-5, weight_update="nearest")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixtrain.MixtrainWarning)  # said once above; this one says it too
        with mixtrain.watch(ours_model, ours, every=4) as exact:
            bf16_loop(ours_model, ours, x, y, 40)
    exact_counts = exact.to_dict()["lost_updates"]
    assert exact_counts["exact"] and exact_counts["counted_steps"] == 40
    share = sum(c["lost"] for c in exact_counts["per_param"].values()) / \
        sum(c["intended"] for c in exact_counts["per_param"].values())
    assert abs(watched - share) <= 0.03, (watched, share)
    assert exact.report().verdict == "lost_updates"
    assert exact.report().cure[0].startswith("opt.weight_update = 'stochastic'")
    # And it is the optimizer's own count: what lost_updates() says since the start.
    assert ours.lost_updates()["fraction"] == pytest.approx(share, abs=1e-12)


def test_healthy_fp16_and_bf16_loops_are_healthy_with_no_warning():
    base = pretrained_norm_mlp()
    x, y = data(1024, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mixtrain.MixtrainWarning)
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu")
        with mixtrain.watch(model, opt, scaler, every=10) as w16:
            fp16_loop(model, opt, scaler, x, y, 60, watch=None)
        bf16 = copy.deepcopy(base).to(torch.bfloat16)
        opt = optim.AdamW(bf16.parameters(), lr=1e-3, weight_update="stochastic")
        with mixtrain.watch(bf16, opt, every=10) as w_bf16:
            bf16_loop(bf16, opt, x, y, 60)
    assert w16.report().verdict == "healthy", w16.report()
    assert w_bf16.report().verdict == "healthy", w_bf16.report()
    assert w16.report().cure == [] and w16.report().doctor_call is None


def test_watched_or_not_the_weights_are_bitwise_the_same():
    base = pretrained_norm_mlp()
    x, y = data(512, 6)
    finals = []
    for watched in (False, True):
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu")
        if watched:
            with mixtrain.watch(model, opt, scaler, every=3) as w:
                fp16_loop(model, opt, scaler, x, y, 20, watch=w)
        else:
            fp16_loop(model, opt, scaler, x, y, 20)
        finals.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*finals))


def test_close_removes_every_hook_and_bad_input_is_one_line():
    model = NormMlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    w = mixtrain.watch(model, opt, scaler, every=2)
    assert any(m._forward_hooks for m in model.modules())  # the first step is sampled
    with pytest.raises(ValueError, match="this model is watched already: close\\(\\) the first watch"):
        mixtrain.watch(model, opt)
    w.close()
    assert not any(m._forward_hooks for m in model.modules())
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    assert "update" not in scaler.__dict__  # the class's method again
    mixtrain.watch(model, opt).close()  # closed: it may be watched again
    frozen = NormMlp().requires_grad_(False)
    with pytest.raises(ValueError, match="the model has no trainable parameters"):
        mixtrain.watch(frozen, torch.optim.SGD(NormMlp().parameters(), lr=0.1))
    with pytest.raises(ValueError, match="invalid every=0"):
        mixtrain.watch(model, opt, every=0)
    with pytest.raises(ValueError, match="not a torch.amp.GradScaler"):
        mixtrain.watch(model, opt, scaler=object())
    with pytest.raises(ValueError, match="the torch.optim optimizer your loop steps"):
        mixtrain.watch(model, "adam")


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the reads of a tensor's value to the host (item(), tolist(), float(t), ...): each is
    aten::_local_scalar_dense at the dispatcher, one per element read."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_between_its_reads_the_watch_adds_no_host_read_to_a_step():
    """torch's GradScaler reads found_inf each step; the watch adds none of its own until its
    block's read (every=100 here: none in 12 steps), sampled step included."""
    base = pretrained_norm_mlp()
    x, y = data(512, 7)
    counts = []
    for watched in (False, True):
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu")
        w = mixtrain.watch(model, opt, scaler, every=100) if watched else None
        with _HostReads() as reads:
            fp16_loop(model, opt, scaler, x, y, 12, watch=w)
        counts.append(reads.reads)
        if w is not None:
            assert w.report().verdict == "healthy"  # the read: now, and outside the count
            w.close()
    assert counts[0] > 0 and counts[1] == counts[0], counts


def test_a_model_without_submodules_and_a_copy_of_a_watched_model_are_watched_too():
    """A bare nn.Linear has no module to hook, but its sampled steps still count lost updates
    (torch's fused AdamW here); a deepcopy of a watched model is another model."""
    torch.manual_seed(0)
    model = nn.Linear(16, 4).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    x, y = data(64, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixtrain.MixtrainWarning)
        with mixtrain.watch(model, opt, every=1) as w:
            copy_of = copy.deepcopy(model)
            mixtrain.watch(copy_of, torch.optim.SGD(copy_of.parameters(), lr=0.1)).close()
            for i in range(3):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x[i * 16:][:16].to(torch.bfloat16)).float(), y[i * 16:][:16]).backward()
                opt.step()
    assert w.to_dict()["lost_updates"]["counted_steps"] == 3
    assert w.report().verdict == "lost_updates", w.report()
