#!/usr/bin/env bash
# [Install]'s acceptance, as a Python user installs mixtrain: a fresh virtual environment,
# torch 2.13 into it (pip takes the machine's local copy) and the build backend, then
#   pip install --no-build-isolation SOURCE_DIR
# and, from a folder outside the repository: the doctor on a small nn.Module, the
# installed `mixtrain` command training 512 samples, and `pip uninstall -y mixtrain`,
# after which neither is there.
# With PREBUILT_LIB (make test passes make check's libmixtrain.a, built from these sources
# against the same torch version) pip compiles only the extension and the command; what
# that leaves out is pip compiling the library itself (the same sources make check compiles
# against the same torch version; run by hand: BENCHMARKS.md, "pip install"). Without it the
# whole package compiles: what make demo compiles, and the extension.
#   pip_install_test.sh SOURCE_DIR WORK BASE_PYTHON [PREBUILT_LIB]
set -euo pipefail
src=$1 work=$2 base=$3 prebuilt=${4:-}
rm -rf "$work/venv" "$work/elsewhere"
mkdir -p "$work/elsewhere"
"$base" -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check torch==2.13.0 'scikit-build-core>=0.11'
args=(-C "build-dir=$work/build")  # kept between runs: a rerun recompiles only what changed
if [ -n "$prebuilt" ]; then args+=(-C "cmake.define.MIXTRAIN_PREBUILT_LIBRARY=$prebuilt"); fi
"$py" -m pip install -q --disable-pip-version-check --no-build-isolation "${args[@]}" "$src"

# A wheel's name says the torch it was built for (the build folder is warm: seconds).
rm -rf "$work/wheel"
"$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps "${args[@]}" -w "$work/wheel" "$src"
ls "$work/wheel"/mixtrain-*+torch2.13.0.cpu-cp3*-linux_*.whl

cd "$work/elsewhere"
# The package is the installed one, and says which torch it was built for.
"$py" - <<'PY'
import importlib.metadata as md
import torch
import mixtrain
assert "site-packages" in mixtrain.__file__, mixtrain.__file__
v = md.version("mixtrain")
assert v.endswith("+torch2.13.0.cpu"), v
assert md.requires("mixtrain") == ["torch==2.13.0"], md.requires("mixtrain")
torch.manual_seed(0)
x = torch.randn(512, 8)
y = (x[:, 0] + x[:, 1] > 0).long()
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
d = mixtrain.doctor(model, (x, y), precision="bf16", epochs=1, bs=32, lr=1e-2, threads=1)
print("doctor:", d.verdict)
assert d.verdict == "healthy", d
PY
cli="$work/venv/bin/mixtrain"
test -x "$cli"
out=$("$cli" train --limit 512 --epochs 1 --threads 1 --out "$work/elsewhere/run")
echo "$out" | tail -2
echo "$out" | grep -q "valid accuracy"
test -f "$work/elsewhere/run/summary.json"

# Another torch under it: one line naming both and pip's command that rebuilds.
msg=$("$py" -c "import torch; torch.__version__ = '2.99.0+cpu'; import mixtrain" 2>&1 | tail -1 || true)
echo "$msg"
echo "$msg" | grep -q "^ImportError: mixtrain was built against torch 2.13.0 .*this Python imports torch 2.99.0 .*($py -m pip install --no-build-isolation --force-reinstall $src)$"

"$py" -m pip uninstall -y -q mixtrain
test ! -e "$cli" || { echo "pip uninstall left $cli"; exit 1; }
if "$py" -c "import mixtrain" 2>/dev/null; then echo "pip uninstall left the package importable"; exit 1; fi
echo "pip install, doctor, train and uninstall: ok"
