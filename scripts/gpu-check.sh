#!/usr/bin/env bash
# The GPU check: one prepared run on the device machine (an H200 with PyTorch 2.x
# and its libtorch), under 8 minutes. Results: $OUT/gpu.json and $OUT/gpu-check.log.
#
#   bash scripts/gpu-deps.sh                      here, once: .gpu-deps/ (headers, googletest)
#   run(command="bash scripts/gpu-check.sh", carry=[".gpu-deps"], timeout_s=540)
#   bash scripts/gpu-check.sh --cpu-smoke         CI: the same pipeline on CPU with tiny
#                                                 sizes, using the build in $MIXTRAIN_GPU_CHECK_BUILD
#
# Steps (GPU mode): environment facts; a Release build against the machine's libtorch
# (ccache off, tests and benchmarks on); the CUDA tests; torch's own Python GradScaler
# on the tests' scripted overflow pattern, compared with ours; real fp16 against the CPU
# emulation (50 seeded steps of the three models; the held-in doctor cases' verdicts);
# gpu_bench (C++, mixtrain's
# Learner) and gpu_python_bench.py (a torch.amp loop) on the CNN, the ResNet-style CNN
# and the transformer LM in fp32/fp16/bf16; then everything merged into gpu.json with
# the issue's goals checked. A failing step is recorded and the next one still runs.
set -uo pipefail
mode=gpu
case "${1:-}" in
  "") ;;
  --cpu-smoke) mode=cpu-smoke ;;
  *) echo "gpu-check: error: unknown argument '$1' (only --cpu-smoke)" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$root/gpu-check-out}
mkdir -p "$OUT"
log="$OUT/gpu-check.log"
: > "$log"
step() { echo "== $(date +%T) $*" | tee -a "$log"; }
# Runs a step with a time limit, logging its output; records its exit code in $OUT/status.
run_step() {
  local name=$1 limit=$2
  shift 2
  step "$name"
  timeout "$limit" "$@" >> "$log" 2>&1
  local code=$?
  echo "$name $code" >> "$OUT/status"
  [ "$code" = 0 ] || echo "   $name: exit $code (see gpu-check.log)" | tee -a "$log"
  return 0
}
: > "$OUT/status"
cd "$root"

if [ "$mode" = gpu ]; then
  py=python3
  run_step environment 60 bash -c "nvidia-smi; nvcc --version; $py -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'"
  prefix=$($py -c 'import torch; print(torch.utils.cmake_prefix_path)')
  extra=()
  if [ -d .gpu-deps ]; then
    extra+=("-DCMAKE_PREFIX_PATH=$prefix;$root/.gpu-deps" "-DCMAKE_CXX_FLAGS=-isystem $root/.gpu-deps/include")
    [ -d /usr/src/googletest ] || extra+=("-DMIXTRAIN_GTEST_SOURCE_DIR=$root/.gpu-deps/googletest")
    if [ ! -e /usr/include/zlib.h ]; then
      libz=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')
      extra+=("-DZLIB_INCLUDE_DIR=$root/.gpu-deps/include" "-DZLIB_LIBRARY=$libz")
    fi
  else
    extra+=("-DCMAKE_PREFIX_PATH=$prefix")
  fi
  # The device's own torch, found as everywhere else: through its Python (cmake_prefix_path,
  # torch's ABI flag and pybind11); pip's CUDA headers beside it fill a partial toolkit.
  run_step configure 120 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER= \
    -DMIXTRAIN_PYTHON="$(command -v $py)" -DCMAKE_CUDA_ARCHITECTURES=90 -DMIXTRAIN_BUILD_EXAMPLES=OFF "${extra[@]}"
  run_step build 300 cmake --build build-gpu -j "$(nproc)" --target mixtrain_tests gpu_bench mixtrain_cli
  run_step cuda_tests 120 env MIXTRAIN_SCALE_SEQUENCE_OUT="$OUT/cpp_scales.txt" build-gpu/tests/mixtrain_tests \
    --gtest_filter='CudaTest.*:Fp32IslandsTest.*:HostReadsTest.*:AutocastTest.*:GradScalerTest.*:LossScaleRuleTest.*:PrecisionTest.*:DataParallelTest.*:PureBf16Test.*:ForwardPaths/PureBf16PathTest.*' --gtest_output="json:$OUT/tests.json"
  run_step torch_gradscaler 60 $py - "$OUT/py_scales.txt" <<'PY'
import sys, torch
# The pattern of CudaTest.Fp16AutocastWithFusedScalerOpsFollowsTorchsScaleRule:
# 8 steps, inf in the gradients at steps 0, 1 and 4, init_scale 2^16, growth_interval 2.
model = torch.nn.Linear(4, 3).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cuda", init_scale=65536.0, growth_interval=2)
scales = []
for step in range(8):
    x = torch.randn(16, 4, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad()
    scaler.scale(loss).backward()
    if step in (0, 1, 4):
        model.weight.grad.view(-1)[0] = float("inf")
    scales.append(scaler.get_scale())
    scaler.step(opt)
    scaler.update()
open(sys.argv[1], "w").write("".join(f"{s:g}\n" for s in scales))
PY
  run_step emulation 180 build-gpu/bench/gpu_bench --emulation-compare --device cuda --steps 50 --init-scale 1073741824 \
    --json "$OUT/emulation.jsonl"
  run_step doctor 240 build-gpu/bench/gpu_bench --doctor-compare --device cuda --json "$OUT/doctor.jsonl"
  run_step bench_cpp 240 build-gpu/bench/gpu_bench --device cuda --steps 30 --warmup 5 --json "$OUT/cpp.jsonl"
  run_step bench_python 240 $py bench/gpu_python_bench.py --device cuda --steps 30 --warmup 5 --json "$OUT/py.jsonl"
else
  py=${MIXTRAIN_GPU_CHECK_PYTHON:-python3}
  build=${MIXTRAIN_GPU_CHECK_BUILD:?set MIXTRAIN_GPU_CHECK_BUILD to a build directory}
  small=(--device cpu --tiny --precisions fp32,bf16 --steps 2 --warmup 1)
  run_step bench_cpp 240 "$build/bench/gpu_bench" "${small[@]}" --json "$OUT/cpp.jsonl"
  run_step emulation 240 "$build/bench/gpu_bench" --emulation-compare --device cpu --models cnn --steps 3 \
    --json "$OUT/emulation.jsonl"
  run_step doctor 240 "$build/bench/gpu_bench" --doctor-compare --device cpu --json "$OUT/doctor.jsonl"
  if $py -c 'import torch' 2>/dev/null; then
    run_step bench_python 240 $py bench/gpu_python_bench.py "${small[@]}" --json "$OUT/py.jsonl"
  fi
fi

step merge
$py - "$OUT" "$mode" <<'PY'
import json, os, sys
out, mode = sys.argv[1], sys.argv[2]
def rows(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p) if l.strip()] if os.path.exists(p) else None
def lines(name):
    p = os.path.join(out, name)
    return [l.strip() for l in open(p) if l.strip()] if os.path.exists(p) else None
status = dict(l.split() for l in open(os.path.join(out, "status")) if l.strip())
cpp, py = rows("cpp.jsonl"), rows("py.jsonl")
def get(rs, model, prec):
    for r in rs or []:
        if r.get("model") == model and r.get("precision") == prec and "error" not in r:
            return r
summary, goals = {}, {}
for m in ("cnn", "resnet", "transformer"):
    base = get(cpp, m, "fp32")
    tf32 = get(cpp, m, "tf32")
    for p in ("fp16", "bf16"):
        r = get(cpp, m, p)
        if base and r:
            summary[f"{m}_{p}_speedup_vs_fp32"] = r["samples_per_second"] / base["samples_per_second"]
            if r.get("peak_memory_bytes") and base.get("peak_memory_bytes"):
                summary[f"{m}_{p}_peak_memory_vs_fp32"] = r["peak_memory_bytes"] / base["peak_memory_bytes"]
        if tf32 and r:
            summary[f"{m}_{p}_speedup_vs_tf32"] = r["samples_per_second"] / tf32["samples_per_second"]
    for p in ("fp32", "tf32", "fp16", "bf16"):
        a, b = get(cpp, m, p), get(py, m, p)
        if a and b:
            summary[f"{m}_{p}_cpp_over_python_step_time"] = a["step_ms"] / b["step_ms"]
            # C++'s loader holds every timed batch on the device, Python's loop one: compare
            # the peaks with one batch each.
            if a.get("peak_memory_beyond_data_bytes") and b.get("peak_memory_bytes"):
                summary[f"{m}_{p}_cpp_over_python_peak_memory"] = a["peak_memory_beyond_data_bytes"] / b["peak_memory_bytes"]
            # Ops a step: each is a kernel launch or more on a GPU ([Speed]: no more than Python's).
            if a.get("ops_per_step") and b.get("ops_per_step"):
                summary[f"{m}_{p}_cpp_over_python_ops_per_step"] = a["ops_per_step"] / b["ops_per_step"]
        if a:
            summary[f"{m}_{p}_host_scalar_reads_per_step"] = a["host_scalar_reads_per_step"]
for m, goal in (("resnet", 1.4), ("transformer", 2.0)):
    for p in ("fp16", "bf16"):
        k = f"{m}_{p}_speedup_vs_tf32"
        if k in summary:
            goals[f"{k} >= {goal}"] = summary[k] >= goal
for m in ("cnn", "resnet", "transformer"):
    for p in ("fp32", "tf32", "fp16", "bf16"):
        k = f"{m}_{p}_cpp_over_python_step_time"
        if k in summary:
            goals[f"{k} <= 0.9"] = summary[k] <= 0.9
        k = f"{m}_{p}_host_scalar_reads_per_step"
        if k in summary:
            goals[f"{k} <= 1"] = summary[k] <= 1
        k = f"{m}_{p}_cpp_over_python_ops_per_step"
        if k in summary:
            goals[f"{k} <= 1"] = summary[k] <= 1
emu = rows("emulation.jsonl") or []
for r in emu:
    if "error" in r:
        continue
    m = r["model"]
    summary[f"emulation_{m}_first_step_rel_diff"] = r["first_step_rel_diff"]
    summary[f"emulation_{m}_max_abs_loss_diff"] = r["max_abs_diff"]
    goals[f"emulation_{m}_first_step_within_fp16"] = r["first_step_within_fp16"]
    goals[f"emulation_{m}_same_skipped_steps"] = r["same_skips"]
doctor = rows("doctor.jsonl") or []
for r in doctor:
    if "error" not in r:
        goals[f"doctor_{r['case']}_same_verdict_on_device_and_emulated"] = r["same"]
        goals[f"doctor_{r['case']}_verdict_is_{r['case']}"] = r["device_verdict"] == r["case"]
cs, ps = lines("cpp_scales.txt"), lines("py_scales.txt")
result = {
    "mode": mode,
    "steps": status,
    "tests": json.load(open(os.path.join(out, "tests.json"))) .get("tests") if os.path.exists(os.path.join(out, "tests.json")) else None,
    "scale_sequence": {"cpp": cs, "torch": ps, "identical": cs is not None and cs == ps},
    "cpp": cpp, "python": py, "emulation": emu, "doctor": doctor,
    "summary": {"values": summary, "goals": goals},
}
json.dump(result, open(os.path.join(out, "gpu.json"), "w"), indent=2)
print(json.dumps({"steps": status, "summary": result["summary"], "scale_sequence_identical": result["scale_sequence"]["identical"]}, indent=2))
PY
echo "gpu-check: wrote $OUT/gpu.json and $OUT/gpu-check.log"
