"""mixtrain.optim in a plain PyTorch loop: torch's own update in fp32 (bitwise, with a correctly
rounded root; within a few ulps of torch's MKL root), bf16 storage with stochastic and Kahan
rounding, from_torch with the user's state, state_dict round trips, GradScaler and LR
schedulers, and bad input in one line."""
import copy

import pytest
import torch
import torch.nn as nn

import mixtrain
from correct_root import correctly_rounded_root  # tests/python/correct_root.py
from mixtrain import optim


class NormMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, (x @ torch.randn(8, 3, generator=torch.Generator().manual_seed(1))).argmax(1)


def run(model, opt, steps, seed=0, dtype=torch.float32, scheduler=None):
    x, y = blobs(steps * 16, seed)
    for i in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[i * 16:(i + 1) * 16].to(dtype)).float(), y[i * 16:(i + 1) * 16]).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


CASES = [
    (torch.optim.AdamW, optim.AdamW, dict(lr=1e-2, weight_decay=0.05)),
    (torch.optim.AdamW, optim.AdamW, dict(lr=1e-2, betas=(0.8, 0.95), amsgrad=True)),
    (torch.optim.Adam, optim.Adam, dict(lr=1e-2, weight_decay=1e-3)),
    (torch.optim.Adam, optim.Adam, dict(lr=1e-2, amsgrad=True, maximize=True)),
    (torch.optim.SGD, optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)),
    (torch.optim.SGD, optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1)),
    (torch.optim.SGD, optim.SGD, dict(lr=0.05)),
    (torch.optim.SGD, optim.SGD, dict(lr=0.05, momentum=0.9, maximize=True)),
    (torch.optim.RMSprop, optim.RMSprop, dict(lr=1e-2, weight_decay=1e-3)),
    (torch.optim.RMSprop, optim.RMSprop, dict(lr=1e-2, alpha=0.9, momentum=0.8, centered=True)),
    (torch.optim.RMSprop, optim.RMSprop, dict(lr=1e-2, centered=True, maximize=True)),
    (torch.optim.Adagrad, optim.Adagrad, dict(lr=5e-2, lr_decay=1e-2, weight_decay=1e-3)),
    (torch.optim.Adagrad, optim.Adagrad, dict(lr=5e-2, initial_accumulator_value=0.1, eps=1e-6)),
]


@pytest.mark.parametrize("theirs,ours,kwargs", CASES, ids=[c[0].__name__ + str(i) for i, c in enumerate(CASES)])
def test_in_fp32_each_step_is_torchs_bitwise(theirs, ours, kwargs):
    torch.manual_seed(0)
    a = NormMlp()
    b = copy.deepcopy(a)
    ta, tb = theirs(a.parameters(), foreach=False, **kwargs), ours(b.parameters(), weight_update="stochastic", **kwargs)
    sa = torch.optim.lr_scheduler.StepLR(ta, step_size=4, gamma=0.5)
    sb = torch.optim.lr_scheduler.StepLR(tb, step_size=4, gamma=0.5)
    with correctly_rounded_root():
        run(a, ta, 12, scheduler=sa)
    run(b, tb, 12, scheduler=sb)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)  # fp32 storage rounds by no rule: the stochastic one does not apply
    # The state in torch's own layout, both ways.
    ta2 = theirs(a.parameters(), **kwargs)
    ta2.load_state_dict(tb.state_dict())
    tb2 = ours(b.parameters(), **kwargs)
    tb2.load_state_dict(ta.state_dict())
    for key in ta.state_dict()["state"].get(0, {}):  # (SGD without momentum keeps none)
        assert torch.equal(ta.state_dict()["state"][0][key], tb.state_dict()["state"][0][key]), key


BIG = 5 * (1 << 15) + 13  # two compute chunks of the core (of 4 rounding spans each) and a ragged tail


@pytest.mark.parametrize("theirs,ours,kwargs", CASES, ids=[c[0].__name__ + str(i) for i, c in enumerate(CASES)])
def test_bf16_storage_is_torchs_fp32_step_on_the_bf16_values_rounded_once(theirs, ours, kwargs):
    """The core widens a 16-bit tensor a chunk at a time: its step equals torch's own step run on
    fp32 tensors that hold the same bf16 values, with the results rounded to bf16 once."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(BIG, generator=g).bfloat16()
    grads = [torch.randn(BIG, generator=g).mul_(1e-2).bfloat16() for _ in range(4)]
    ref = w.float().clone().requires_grad_()
    mine = w.clone().requires_grad_()
    ta, tb = theirs([ref], foreach=False, **kwargs), ours([mine], weight_update="nearest", **kwargs)

    @torch.no_grad()
    def round_reference():  # weight and state held as bf16 values, as bf16 storage holds them
        ref.copy_(ref.bfloat16().float())
        for key, value in ta.state[ref].items():
            if key != "step" and torch.is_tensor(value):
                value.copy_(value.bfloat16().float())

    round_reference()  # Adagrad's initial sum (0.1 is not a bf16 value)
    for grad in grads:
        ref.grad, mine.grad = grad.float(), grad.clone()
        with correctly_rounded_root():
            ta.step()
        tb.step()
        round_reference()
        assert mine.dtype == torch.bfloat16
        assert torch.equal(mine.float(), ref.detach())
        for key, value in tb.state[mine].items():
            if key != "step":
                assert value.dtype == torch.bfloat16, key
                assert torch.equal(value.float(), ta.state[ref][key]), key


ROOTED = [c for c in CASES if c[0] is not torch.optim.SGD]


@pytest.mark.parametrize("theirs,ours,kwargs", ROOTED, ids=[c[0].__name__ + str(i) for i, c in enumerate(ROOTED)])
def test_against_torchs_own_mkl_root_one_step_differs_only_downstream_of_the_root(theirs, ours, kwargs):
    """The documented bound: from the same state, one step of the core against torch.optim's own
    (its root MKL's, an ulp off in about 17% of elements). What does not depend on the root (Adam's
    moments, RMSprop's square_avg, Adagrad's sum) is bitwise; the weight is within 4 ulps of the
    larger of the new weight and the update, and the root changes some weights (or the test would
    prove nothing). Where MKL takes its AVX2 path, its root is correctly rounded: then every
    weight is bitwise torch's."""
    probe = torch.rand(1 << 16, generator=torch.Generator().manual_seed(3))
    torchs_root_is_off = not torch.equal(probe.sqrt(), probe.double().sqrt().float())
    g = torch.Generator().manual_seed(11)
    n = 1 << 16
    w = torch.randn(n, generator=g)
    ref, mine = w.clone().requires_grad_(), w.clone().requires_grad_()
    ta, tb = theirs([ref], foreach=False, **kwargs), ours([mine], **kwargs)
    differing = 0
    for step in range(4):
        grad = torch.randn(n, generator=g).mul_(10.0 ** -step)
        with torch.no_grad():  # the same state before each step
            ref.copy_(mine)
            for key, value in tb.state[mine].items():
                if key != "step" and torch.is_tensor(value):
                    ta.state[ref][key].copy_(value)
        ref.grad, mine.grad = grad.clone(), grad.clone()
        before = mine.detach().clone()
        ta.step()
        tb.step()
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "square_avg", "grad_avg", "sum"):
            if key in tb.state[mine]:
                assert torch.equal(tb.state[mine][key], ta.state[ref][key]), key
        ours_w, theirs_w = mine.detach().double(), ref.detach().double()
        scale = torch.maximum(ours_w.abs(), (ours_w - before.double()).abs()).float()
        ulp = (torch.nextafter(scale, torch.full_like(scale, float("inf"))) - scale).double()
        assert ((ours_w - theirs_w).abs() / ulp).max().item() <= 4
        differing += int((ours_w != theirs_w).sum())
    assert (differing > 0) == torchs_root_is_off


def test_the_core_gives_the_same_bits_on_one_thread_and_two():
    def steps(threads):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            g = torch.Generator().manual_seed(2)
            w = torch.randn(BIG, generator=g).bfloat16().requires_grad_()
            opt = optim.AdamW([w], lr=1e-3, weight_update="stochastic", seed=7)
            for _ in range(3):
                w.grad = torch.randn(BIG, generator=g).bfloat16()
                opt.step()
            return w.detach().clone(), opt.lost_updates()
        finally:
            torch.set_num_threads(before)
    (a, la), (b, lb) = steps(1), steps(2)
    assert torch.equal(a, b) and la == lb


def test_the_core_gives_the_same_bits_on_its_vectorized_path_and_element_by_element(monkeypatch):
    """MIXTRAIN_CPU_AVX2=0 runs the core's CPU passes one element at a time, as on a CPU
    without AVX2: the same weights and lost-update counts to the bit, in fp32 and in each bf16
    rule. cpu_pass_vectorized() says the switch took (else both runs would take one path)."""
    flags = set(open("/proc/cpuinfo").read().split())

    def steps():
        out = []
        for kind, dtype, rule in ((optim.AdamW, torch.float32, "nearest"), (optim.AdamW, torch.bfloat16, "nearest"),
                                  (optim.AdamW, torch.bfloat16, "stochastic"), (optim.AdamW, torch.bfloat16, "kahan"),
                                  (optim.SGD, torch.bfloat16, "stochastic")):
            g = torch.Generator().manual_seed(5)
            w = torch.randn(BIG, generator=g).to(dtype).requires_grad_()
            opt = kind([w], lr=1e-3, weight_update=rule, seed=7, **({"momentum": 0.9} if kind is optim.SGD else {}))
            for _ in range(3):
                w.grad = torch.randn(BIG, generator=g).to(dtype)
                opt.step()
            out.append((w.detach().clone(), opt.lost_updates()))
        return out

    monkeypatch.delenv("MIXTRAIN_CPU_AVX2", raising=False)
    assert optim.cpu_pass_vectorized() == ("avx2" in flags and "fma" in flags)
    vectorized = steps()
    monkeypatch.setenv("MIXTRAIN_CPU_AVX2", "0")
    assert not optim.cpu_pass_vectorized()
    by_element = steps()
    for (a, lost_a), (b, lost_b) in zip(vectorized, by_element):
        assert torch.equal(a, b) and lost_a == lost_b


def test_bf16_storage_holds_8_bytes_a_parameter_and_learns_where_nearest_stalls():
    """The new user's case in small: a pretrained LayerNorm MLP fine-tuned in bf16 at a small lr."""
    torch.manual_seed(0)
    pretrained = NormMlp()
    run(pretrained, torch.optim.AdamW(pretrained.parameters(), lr=3e-3), 40, seed=1)
    x, y = blobs(512, 9)

    def finetune(make_opt, dtype):
        model = copy.deepcopy(pretrained).to(dtype)
        opt = make_opt(model.parameters())
        run(model, opt, 60, seed=2, dtype=dtype)
        with torch.no_grad():
            return nn.functional.cross_entropy(model(x.to(dtype)).float(), y).item(), model, opt

    lr = 2e-4
    start = nn.functional.cross_entropy(pretrained(x), y).item()
    fp32, _, _ = finetune(lambda p: torch.optim.AdamW(p, lr=lr), torch.float32)
    bf16, _, _ = finetune(lambda p: torch.optim.AdamW(p, lr=lr), torch.bfloat16)
    stochastic, model, opt = finetune(lambda p: optim.AdamW(p, lr=lr, weight_update="stochastic"), torch.bfloat16)
    kahan, _, _ = finetune(lambda p: optim.AdamW(p, lr=lr, weight_update="kahan"), torch.bfloat16)
    assert start - fp32 > 0.01
    assert start - bf16 < 0.5 * (start - fp32), (start, fp32, bf16)      # torch's bf16 AdamW stalls
    assert abs(stochastic - fp32) < 0.01 * fp32, (fp32, stochastic)        # ours lands within 1% of fp32
    assert abs(kahan - fp32) < 0.01 * fp32, (fp32, kahan)
    state = opt.state[model.fc1.weight]
    assert model.fc1.weight.dtype == state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    lost = opt.lost_updates()
    assert 0 < lost["fraction"] < 1 and lost["weight_update"] == "stochastic"
    assert opt.lost_updates()["fraction"] == 0.0  # counted since the last call


def test_from_torch_keeps_the_users_state_and_groups_and_goes_on():
    torch.manual_seed(0)
    model = NormMlp().to(torch.bfloat16)
    theirs = torch.optim.AdamW([{"params": [model.fc1.weight, model.fc1.bias], "lr": 1e-3},
                                {"params": list(model.norm.parameters()) + list(model.fc2.parameters()), "lr": 5e-4}],
                               weight_decay=0.02)
    run(model, theirs, 5, dtype=torch.bfloat16)
    ours = optim.from_torch(theirs, weight_update="stochastic")
    assert isinstance(ours, optim.AdamW) and ours.weight_update == "stochastic"
    assert [g["lr"] for g in ours.param_groups] == [1e-3, 5e-4]
    assert all(g["weight_decay"] == 0.02 for g in ours.param_groups)
    assert torch.equal(ours.state[model.fc1.weight]["exp_avg"], theirs.state[model.fc1.weight]["exp_avg"])
    assert ours.state[model.fc1.weight]["step"].item() == 5
    run(model, ours, 5, dtype=torch.bfloat16)
    assert ours.state[model.fc1.weight]["step"].item() == 10
    # And back: torch's AdamW takes our state as its own.
    again = torch.optim.AdamW([{"params": [model.fc1.weight, model.fc1.bias]},
                               {"params": list(model.norm.parameters()) + list(model.fc2.parameters())}])
    again.load_state_dict(ours.state_dict())
    assert again.param_groups[1]["lr"] == 5e-4
    assert torch.equal(again.state[model.fc1.weight]["exp_avg"], ours.state[model.fc1.weight]["exp_avg"])


def test_a_grad_scaler_steps_it_under_fp16_autocast():
    torch.manual_seed(0)
    model = NormMlp()
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_update="stochastic")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    x, y = blobs(256, 3)
    losses = []
    for i in range(16):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x[i * 16:(i + 1) * 16]), y[i * 16:(i + 1) * 16])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


class PlainMlp(nn.Module):
    """No norm layer: every parameter is a bf16 tensor in the Learner's bf16-pure too."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


LEARNER_CASES = [
    (optim.AdamW, dict(lr=1e-3, weight_decay=0.05), "stochastic"),
    (optim.AdamW, dict(lr=1e-3, amsgrad=True), "kahan"),
    (optim.AdamW, dict(lr=1e-3), "nearest"),
    (optim.Adam, dict(lr=1e-3, weight_decay=0.01), "stochastic"),
    (optim.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True), "stochastic"),
    (optim.RMSprop, dict(lr=1e-3, momentum=0.5, centered=True), "kahan"),
    (optim.Adagrad, dict(lr=1e-2), "stochastic"),
]


@pytest.mark.parametrize("real_bf16", ["1", "0"], ids=["real-bf16", "emulated-bf16"])
@pytest.mark.parametrize("kind,kwargs,rule", LEARNER_CASES,
                         ids=["%s-%s" % (c[0].__name__, c[2]) for c in LEARNER_CASES])
def test_its_step_is_the_learners_step_in_bf16_pure_on_the_same_batches(kind, kwargs, rule, real_bf16, monkeypatch):
    """The doctor's bf16-pure arm from a loop's state is mixtrain's Learner stepping the loop's
    optimizer, rounding rule, seed and Kahan compensation on the loop's next batches. The same
    batches stepped in Python by mixtrain.optim end on bitwise the same weights: the validation
    loss the Learner measures is the one Python measures, to the last bit. (A bf16 model's norm
    layers differ: the Learner keeps their parameters in fp32 tensors of bf16 values, and CPU
    layer_norm's backward with fp32 parameters is not its all-bf16 backward.) Both of the Learner's
    bf16 paths: bf16 storage stepped by the core (a CPU with bf16 units), and fp32 storage with
    the emulated forward, rounded after the step from the same stream."""
    monkeypatch.setenv("MIXTRAIN_CPU_BF16", real_bf16)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = PlainMlp().to(torch.bfloat16)
    x, y = blobs(512, 4)
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 512, 32)]
    # Two groups: the stochastic stream's parameter index runs across them.
    groups = [{"params": model.fc1.parameters()}, {"params": model.fc2.parameters()}]
    opt = kind(groups, weight_update=rule, seed=3, **kwargs)

    def step(m, o, xb, yb):
        o.zero_grad()
        nn.functional.cross_entropy(m(xb.to(torch.bfloat16)).float(), yb).backward()
        o.step()

    for xb, yb in batches[:4]:  # the loop so far: state, step counts and compensations to carry
        step(model, opt, xb, yb)
    replay = copy.deepcopy(model)
    replay_opt = kind([{"params": replay.fc1.parameters()}, {"params": replay.fc2.parameters()}], weight_update=rule,
                      seed=3, **kwargs)
    replay_opt.load_state_dict(opt.state_dict())
    if rule == "kahan":
        assert any(opt.state[p]["kahan_comp"].abs().max() > 0 for p in model.parameters())
    window = batches[4:12]
    d = mixtrain.doctor(model, window, optimizer=opt, steps=8, threads=1, max_trials=0)
    learner_valid = d.to_dict()["evidence"]["mixed"]["valid_loss"]
    assert d.to_dict()["evidence"]["mixed"]["lost_updates"]["weight_update"] == rule
    assert d.to_dict()["evidence"]["mixed"]["emulated"] == (real_bf16 == "0")

    for xb, yb in window:
        step(replay, replay_opt, xb, yb)
    replay.eval()
    with torch.no_grad():  # the Learner's validation: each batch's mean loss, weighted by its size
        total = sum(nn.functional.cross_entropy(replay(xb.to(torch.bfloat16)).float(), yb).item() * len(yb)
                    for xb, yb in window)
    assert learner_valid == total / 256
    # The other seed rounds otherwise: the equality above is the stream's, not a coincidence.
    if rule == "stochastic":
        other = copy.deepcopy(model)
        other_opt = kind([{"params": other.fc1.parameters()}, {"params": other.fc2.parameters()}],
                         weight_update=rule, seed=4, **kwargs)
        other_opt.load_state_dict(opt.state_dict())
        for xb, yb in window:
            step(other, other_opt, xb, yb)
        assert any(not torch.equal(a, b) for a, b in zip(other.parameters(), replay.parameters()))


def test_the_doctor_replays_the_loops_own_rounding_rule():
    """mixtrain.optim's rule is the loop's: the doctor's bf16-pure arm rounds with it, and a
    weight_update= that says otherwise is one line."""
    model = PlainMlp().to(torch.bfloat16)
    x, y = blobs(256, 5)
    opt = optim.AdamW(model.parameters(), lr=1e-3, weight_update="stochastic")
    with pytest.raises(ValueError, match="the loop's optimizer rounds 'stochastic'"):
        mixtrain.doctor(model, [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)], optimizer=opt, steps=8,
                        weight_update="kahan", threads=1, max_trials=0)


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match=r"cannot convert a Adamax: mixtrain.optim converts torch.optim's AdamW, Adam, "
                                         r"SGD, RMSprop and Adagrad"):
        optim.from_torch(torch.optim.Adamax(NormMlp().parameters()))
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="is not a leaf tensor"):
        optim.AdamW([w * 2])
    with pytest.raises(ValueError, match="fp16 parameters take 'nearest' only"):
        optim.AdamW(NormMlp().half().parameters(), weight_update="stochastic")
    with pytest.raises(ValueError, match=r"unknown weight_update='sloppy' \(choices: nearest, stochastic, kahan\)"):
        optim.SGD(NormMlp().parameters(), weight_update="sloppy")
    opt = optim.AdamW(NormMlp().parameters())
    with pytest.raises(ValueError, match="is mixtrain's already"):
        optim.from_torch(opt)
    with pytest.raises(ValueError, match="from_torch takes a torch.optim optimizer, got str"):
        optim.from_torch("adamw")


class TinyEncoder(nn.Module):
    """A small pretrained-style transformer classifier: embedding, one encoder layer, a norm, a head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 32)
        self.block = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.norm(self.block(self.emb(x))).mean(1))


def sequences(n, seed, threshold=6):
    """Sequences of 12 tokens, labelled by how many are below 8 (a task a mean-pooled encoder
    learns), a fifth of the labels flipped (a loss that stays near 0.5, as a language model's
    stays well above 0); a fine-tune moves the threshold."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 16, (n, 12), generator=g)
    y = ((x < 8).sum(1) > threshold).long()
    flip = torch.rand(n, generator=g) < 0.2
    return x, torch.where(flip, 1 - y, y)


def test_the_new_users_case_doctor_then_the_line_then_fp32s_result():
    """A plain loop fine-tunes a pretrained transformer in bf16 with AdamW at a small lr and
    stalls; the doctor says lost_updates and hands over the line; the loop runs it, goes on,
    and ends within 1% of the fp32 loop's validation loss, on 8 bytes a parameter."""
    torch.manual_seed(0)
    model = TinyEncoder()
    x, y = sequences(4096, 1)
    pre = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for i in range(150):
        pre.zero_grad()
        nn.functional.cross_entropy(model(x[i * 16 % 4096:(i * 16 % 4096) + 16]), y[i * 16 % 4096:(i * 16 % 4096) + 16]).backward()
        pre.step()
    vx, vy = sequences(512, 2, threshold=5)
    fx, fy = sequences(4096, 3, threshold=5)  # the fine-tuning data: the threshold moved
    batches = [(fx[i:i + 32], fy[i:i + 32]) for i in range(0, len(fx), 32)]
    fp32 = copy.deepcopy(model)
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    lr = 1e-4
    fp32_opt = torch.optim.AdamW(fp32.parameters(), lr=lr)
    opt = torch.optim.AdamW(bf16.parameters(), lr=lr)

    def steps(m, o, chunk, dtype):
        for xb, yb in chunk:
            o.zero_grad()
            nn.functional.cross_entropy(m(xb).float(), yb).backward()
            o.step()

    def valid(m):
        with torch.no_grad():
            return nn.functional.cross_entropy(m(vx).float(), vy).item()

    start = valid(fp32)
    steps(fp32, fp32_opt, batches[:40], torch.float32)
    steps(bf16, opt, batches[:40], torch.bfloat16)
    assert start - valid(bf16) < 0.5 * (start - valid(fp32))  # the stall: at most half of fp32's progress

    d = mixtrain.doctor(bf16, iter(batches[40:]), optimizer=opt, steps=40, valid=(vx, vy), threads=1)
    assert d.verdict == "lost_updates", d.report
    assert d.loop_lines == ["opt = mixtrain.optim.from_torch(opt, weight_update='stochastic')  # your optimizer, its "
                            "state and hyper-parameters, each update rounded stochastically"], d.report
    exec(d.loop_lines[0].split("#")[0], {"mixtrain": mixtrain}, scope := {"opt": opt})
    pasted = scope["opt"]
    applied = d.apply(bf16, opt)  # the same, done for you
    assert type(pasted) is type(applied) is optim.AdamW and pasted.weight_update == applied.weight_update == "stochastic"
    for p in bf16.parameters():  # both carry the loop's own AdamW state on
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(pasted.state[p][key], applied.state[p][key]) and torch.equal(applied.state[p][key],
                                                                                            opt.state[p][key])
    assert d.islands is None
    # Had the loop already run mixtrain's optimizer (rounding to nearest), the line changes its rule.
    ours = optim.from_torch(opt, weight_update="nearest")
    d2 = mixtrain.doctor(bf16, iter(batches[40:]), optimizer=ours, steps=40, valid=(vx, vy), threads=1)
    assert d2.verdict == "lost_updates", d2.report
    assert d2.loop_lines == ["opt.weight_update = 'stochastic'  # mixtrain's optimizer already: only its rounding "
                             "changes"], d2.report
    exec(d2.loop_lines[0].split("#")[0], {}, {"opt": ours})  # the printed line, run as printed
    assert ours.weight_update == "stochastic"
    assert d2.apply(bf16, ours) is ours and ours.weight_update == "stochastic"
    opt = applied
    # The loop goes on after the window the doctor read (the fp32 loop trains on those batches,
    # so both take the same number of steps), then both finish the fine-tune.
    steps(fp32, fp32_opt, batches[40:80], torch.float32)
    for _ in range(3):
        steps(fp32, fp32_opt, batches, torch.float32)
        steps(bf16, opt, batches, torch.bfloat16)
    print("validation loss: start %.4f, fp32 %.4f, bf16 with the cure %.4f" % (start, valid(fp32), valid(bf16)))
    assert abs(valid(bf16) - valid(fp32)) < 0.01 * valid(fp32), (start, valid(fp32), valid(bf16))
    for p in bf16.parameters():  # 2 bytes a weight, 2 a gradient, 2 + 2 of AdamW's state
        assert p.dtype == opt.state[p]["exp_avg"].dtype == opt.state[p]["exp_avg_sq"].dtype == torch.bfloat16
