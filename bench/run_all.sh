#!/usr/bin/env bash
# Runs every benchmark in bench/. Usage: bench/run_all.sh [BUILD_DIR]
set -euo pipefail
# The Python whose torch the build uses (the peers run the same torch).
py=${MIXTRAIN_PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
cd "$(dirname "$0")/.."
build=${1:-build}
echo "== train_bench: 1 epoch, mixtrain vs Python loop vs raw libtorch loop"
bash bench/train_bench.sh "$build" 5
echo "== amp_bench: fused unscale bandwidth, GradScaler overhead, emulation cost (CNN, transformer), rounding bandwidth"
"$build/bench/amp_bench"
echo "== model_bench: TorchScript vs native CNN, transformer step vs PyTorch-Python"
bash bench/model_bench.sh "$build" 5
echo "== master_weights_bench: master copy overhead with and without flat_master"
"$build/bench/master_weights_bench"
echo "== pure_bf16_bench: the bf16-pure step against fp32 and bf16, weight-update rules, lost-update counting"
"$build/bench/pure_bf16_bench"
echo "== doctor_bench: the doctor's cost against one fp32 training run (a proven cure, a healthy verdict)"
"$build/bench/doctor_bench"
echo "== branch_bench: doctor --from a 1-epoch and an 8-epoch run, against the doctor from scratch"
bash bench/branch_bench.sh "$build" 1
echo "== checkpoint_bench: save/load time against size"
"$build/bench/checkpoint_bench"
echo "== distributed_bench: 1 vs 2 ranks (mixtrain launch, Gloo), all-reduce share of a step"
bash bench/distributed_bench.sh "$build" 3
echo "== thread_budget_bench: the default thread count pinned to one CPU and under 2 local ranks, against every CPU online"
bash bench/thread_budget_bench.sh "$build" 2
echo "== batch_norm_bench: the CNN step with models::BatchNorm2d's fast forward against torch's kernel"
bash bench/batch_norm_bench.sh "$build" 3
echo "== front_door_bench: mixtrain.doctor from Python vs mixtrain doctor (CLI), same model and data"
PYTHONPATH="$build/python" "$py" bench/front_door_bench.py "$build/tools/mixtrain/mixtrain" 3
echo "== step_table: the Learner's step against a torch loop (CNN, MLP, ResNet-18, the small GPT), 1 round"
resnet18=""
if [ -x .venv-cuda/bin/python ]; then  # torchvision imports there, not beside the 2.13 CPU wheel
  resnet18=$(mktemp -d)/resnet18.pt
  .venv-cuda/bin/python -c "import sys, torch, torchvision; torch.manual_seed(0); torch.jit.script(torchvision.models.resnet18(num_classes=10)).save(sys.argv[1])" "$resnet18" 2>/dev/null || resnet18=""
fi
"$py" bench/step_table.py "$build" 1 $resnet18 2>/dev/null
