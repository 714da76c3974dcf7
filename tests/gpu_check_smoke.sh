#!/usr/bin/env bash
# CPU-side test of the GPU check: gpu_bench's flags and JSON, the Python twin when
# PYTHON imports torch, and scripts/gpu-check.sh's merge into gpu.json.
#   gpu_check_smoke.sh BUILD_DIR SOURCE_DIR SCRATCH PYTHON
set -euo pipefail
build=$1 src=$2 scratch=$3 python=$4
rm -rf "$scratch" && mkdir -p "$scratch"
bench="$build/bench/gpu_bench"

# Bad flags: one line, exit 2.
for bad in "--steps 0" "--models vgg" "--precisions fp8" "--device tpu" "--bogus"; do
  set +e
  "$bench" $bad > "$scratch/out" 2> "$scratch/err"
  code=$?
  set -e
  [ "$code" = 2 ] || { echo "gpu_bench $bad: exit $code, expected 2"; exit 1; }
  [ "$(wc -l < "$scratch/err")" = 1 ] || { echo "gpu_bench $bad: not one line:"; cat "$scratch/err"; exit 1; }
  grep -q "^gpu_bench: error: " "$scratch/err" || { echo "gpu_bench $bad: bad message"; cat "$scratch/err"; exit 1; }
done

# The whole pipeline on CPU with tiny sizes (fp32 and bf16, as the GPU run's bf16 rows).
OUT="$scratch/out-dir" MIXTRAIN_GPU_CHECK_BUILD="$build" MIXTRAIN_GPU_CHECK_PYTHON="$python" \
  bash "$src/scripts/gpu-check.sh" --cpu-smoke > "$scratch/check.log" 2>&1 || { cat "$scratch/check.log"; exit 1; }
"$python" - "$scratch/out-dir/gpu.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["mode"] == "cpu-smoke", j["mode"]
rows = j["cpp"]
assert {(r["model"], r["precision"]) for r in rows} == {(m, p) for m in ("cnn", "resnet", "transformer") for p in ("fp32", "bf16")}, rows
for r in rows:
    assert "error" not in r, r
    assert r["samples_per_second"] > 0 and r["steps"] == 2 and r["peak_memory_bytes"] is None, r
    assert r["host_scalar_reads_per_step"] >= 0, r
    assert r["ops_per_step"] > 0, r
assert "summary" in j and "goals" in j["summary"], j.keys()
assert all(code == "0" for code in j["steps"].values()), j["steps"]
if j["python"] is not None:  # PYTHON imports torch: the twin ran too
    assert {(r["model"], r["precision"]) for r in j["python"]} == {(r["model"], r["precision"]) for r in rows}, j["python"]
    assert all("error" not in r for r in j["python"]), j["python"]
    assert "cnn_fp32_cpp_over_python_step_time" in j["summary"]["values"], j["summary"]
    assert all(r["ops_per_step"] > 0 for r in j["python"]), j["python"]
    # The Learner's step dispatches fewer ops than the torch loop's on every tiny model.
    assert all(j["summary"]["goals"][f"{m}_{p}_cpp_over_python_ops_per_step <= 1"]
               for m in ("cnn", "resnet", "transformer") for p in ("fp32", "bf16")), j["summary"]
# The emulation comparison and the held-in doctor cases ran (both sides on the CPU here).
assert len(j["emulation"]) == 1 and "error" not in j["emulation"][0], j["emulation"]
assert j["emulation"][0]["same_skips"] and j["emulation"][0]["max_abs_diff"] == 0, j["emulation"]
assert [r["case"] for r in j["doctor"]] == ["healthy", "forward_overflow", "underflow", "gradient_overflow"], j["doctor"]
for r in j["doctor"]:
    assert "error" not in r and r["same"] and r["device_verdict"] == r["case"], r
print("gpu.json ok:", len(rows), "C++ rows,", "no" if j["python"] is None else len(j["python"]), "Python rows,",
      len(j["doctor"]), "doctor cases")
PY
