"""The bad-input tests' files (tests/cli_bad_input_test.cpp): what a hostile tester, or an
unlucky user, hands mixtrain. `.venv/bin/python tests/python/export_bad_input.py OUT_DIR`
(Debian's python3-torch); seeded, so every run writes the same files.
"""
import pathlib
import sys

import torch
import torch.nn as nn

folder = pathlib.Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
path = lambda name: str(folder / name)  # noqa: E731


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(7, 10)

    def forward(self, x):
        return self.fc(x)


class Hang(nn.Module):  # a forward that never returns once a real batch arrives (the probe has 2 samples)
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(7, 10)

    def forward(self, x):
        i = 0
        if x.size(0) > 2:
            while i >= 0:
                i = i + 1
        return self.fc(x)


class Boom(nn.Module):  # raises inside the model, for batches larger than the probe's
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(7, 10)

    def forward(self, x):
        x = self.fc(x)
        if x.size(0) > 2:
            raise RuntimeError("boom in forward")
        return x


class MisfitAfterProbe(nn.Module):  # a kernel's error inside the script, for batches larger than the probe's
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(7, 10)

    def forward(self, x):
        if x.size(0) > 2:
            x = x[:, :3]
        return self.fc(x)


class Layers(nn.Module):  # a ModuleList whose second layer does not fit the first
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(7, 3), nn.Linear(7, 10)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Normed(nn.Module):  # BatchNorm: NaN inputs reach its running statistics, not the parameters
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(7)
        self.fc = nn.Linear(7, 10)

    def forward(self, x):
        return self.fc(self.bn(x))


class CountsTrainingCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(7, 10)
        self.calls = 0

    def count(self, x) -> int:
        """The training forwards of real batches so far (the probe's have 2 samples)."""
        if self.training and x.size(0) > 2:
            self.calls += 1
            return self.calls
        return 0


class HangLater(CountsTrainingCalls):  # trains 25 steps (an epoch of data.pt and some), then its forward never returns
    def forward(self, x):
        if self.count(x) > 25:
            i = 0
            while i >= 0:
                i = i + 1
        return self.fc(x)


class BoomLater(CountsTrainingCalls):  # the model's own check fails at its 10th training forward
    def forward(self, x):
        if self.count(x) == 10:
            raise RuntimeError("boom at call 10")
        return self.fc(x)


class NormedMLP(nn.Module):  # Linear -> LayerNorm -> Linear: an island fed a bf16 activation
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(7, 16)
        self.ln1 = nn.LayerNorm(16)
        self.l2 = nn.Linear(16, 10)

    def forward(self, x):
        return self.l2(torch.relu(self.ln1(self.l1(x))))


for name, model in [("mlp", MLP()), ("hang", Hang()), ("boom", Boom()), ("misfit", MisfitAfterProbe()), ("layers", Layers()),
                    ("normed", Normed()), ("hang_later", HangLater()), ("boom_later", BoomLater()), ("normed_mlp", NormedMLP())]:
    torch.jit.script(model).save(path(name + ".pt"))

x = torch.randn(600, 7)
y = torch.randint(0, 10, (600,))
vx, vy = torch.randn(100, 7), torch.randint(0, 10, (100,))
torch.save({"x": x, "y": y}, path("data.pt"))
torch.save(MLP().state_dict(), path("mlp_state_dict.pt"))  # a state_dict given as --model
torch.save(MLP(), path("mlp_pickled.pt"))  # a whole module pickled with torch.save
y_out = y.clone()
y_out[5] = 10
torch.save({"x": x, "y": y_out, "valid_x": vx, "valid_y": vy}, path("y_class_10.pt"))
y_neg = y.clone()
y_neg[7] = -1
torch.save({"x": x, "y": y_neg, "valid_x": vx, "valid_y": vy}, path("y_class_minus_1.pt"))
torch.save({"x": x, "y": y, "valid_x": vx, "valid_y": torch.full((100,), 99)}, path("valid_y_99.pt"))
torch.save({"x": x, "y": torch.full((600,), -100), "valid_x": vx, "valid_y": vy}, path("y_all_ignored.pt"))
torch.save({"x": x, "y": y, "valid_x": torch.randn(100, 3, 7), "valid_y": vy}, path("valid_x_3_channels.pt"))
vx_nan = vx.clone()
vx_nan[3, 2] = float("nan")
torch.save({"x": x, "y": y, "valid_x": vx_nan, "valid_y": vy}, path("valid_x_nan.pt"))
x_nan = x.clone()
x_nan[:, 0] = float("nan")
torch.save({"x": x_nan, "y": y, "valid_x": vx, "valid_y": vy}, path("x_nan.pt"))
