"""[Speed]'s step table: bench/step_ops (the Learner) against bench/python_step_ops.py (a
plain torch loop) on each model and mode, in interleaved rounds, as one markdown table of
medians for BENCHMARKS.md. "Around the model" is the step's data, optimizer and callback
phases; "outside the matrix products" is the profiled step's time less its matrix products
(bench/step_ops.cpp), on the GPT rows.

    .venv/bin/python bench/step_table.py BUILD_DIR ROUNDS [RESNET18_PT] [--only SUBSTRING]

RESNET18_PT: torchvision's resnet18(num_classes=10) as TorchScript, exported with the
torchvision Python (.venv-cuda):
    .venv-cuda/bin/python -c "import torch, torchvision; torch.manual_seed(0);
        torch.jit.script(torchvision.models.resnet18(num_classes=10)).save('/tmp/resnet18.pt')"
Without it the ResNet-18 rows are left out. Both programs print their JSON lines to stderr
as they run; the table goes to stdout.
"""
import json
import statistics
import subprocess
import sys

MODES = ("fp32", "bf16", "bf16-pure")


def configs(resnet18):
    """(label, step_ops model, python model, batch, extra args, steps) per row group."""
    rows = [("CNN, bs 256", "cnn", "cnn", 256, [], 20),
            ("MLP 784-256-10, bs 64", "mlp", "mlp", 64, [], 100)]
    if resnet18:
        rows.append(("ResNet-18 (TorchScript), bs 64, 3x32x32", resnet18, "resnet18", 64, ["--image", "3x32x32"], 10))
    for threads in (1, 2):
        rows.append((f"GPT 4 x 256, bs 32 x 64 tokens, {threads} thread{'s' if threads > 1 else ''}",
                     "transformer:4x256", "transformer:4x256", 32, ["--threads", str(threads), "--matmul"], 5))
    return rows


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    line = next((l for l in out.stdout.splitlines() if l.startswith("{")), None)
    if out.returncode != 0 or line is None:
        sys.exit(f"step_table.py: {' '.join(cmd)} failed: {out.stderr.strip().splitlines()[-1:]}")
    print(line, file=sys.stderr, flush=True)
    return json.loads(line)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    build, rounds = sys.argv[1], int(sys.argv[2])
    resnet18 = sys.argv[3] if len(sys.argv) > 3 and not sys.argv[3].startswith("--") else None
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    results = {}
    for _ in range(rounds):
        for label, cpp_model, py_model, bs, extra, steps in configs(resnet18):
            if only not in label:
                continue
            for mode in MODES:
                common = [str(bs), mode] + extra + ["--steps", str(steps)]
                a = run([f"{build}/bench/step_ops", cpp_model] + common[:2] + ["core"] + common[2:])
                b = run([sys.executable, "bench/python_step_ops.py", py_model] + common)
                results.setdefault((label, mode), []).append((a, b))
    print("| model | mode | mixtrain step (ms) | torch loop (ms) | ratio | around the model: mixtrain / torch (ms) | ratio "
          "| outside the matrix products: mixtrain / torch (ms) | ratio "
          "| peak RSS beyond start: mixtrain / torch (MB) | ratio | ops | allocations |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    med = statistics.median
    for (label, mode), pairs in results.items():
        ms = [med(p[i]["step_ms"] for p in pairs) for i in (0, 1)]
        if "outside_matmul_ms" in pairs[0][0]:
            o = [med(p[i]["outside_matmul_ms"] for p in pairs) for i in (0, 1)]
            outside = f"{o[0]:.1f} / {o[1]:.1f} | {o[0] / o[1]:.2f}"
        else:
            outside = "- | -"
        # What the loop adds around the model's forward, loss and backward.
        around = [med(sum(p[i]["phases_ms"][k] for k in ("data", "optimizer", "callbacks")) for p in pairs) for i in (0, 1)]
        rss = [med(p[i]["peak_rss_mb"] - p[i]["start_rss_mb"] for p in pairs) for i in (0, 1)]
        a, b = pairs[-1]
        print(f"| {label} | {mode} | {ms[0]:.2f} | {ms[1]:.2f} | {ms[0] / ms[1]:.2f} "
              f"| {around[0]:.2f} / {around[1]:.2f} | {around[0] / around[1]:.2f} | {outside} "
              f"| {rss[0]:.0f} / {rss[1]:.0f} | {rss[0] / rss[1]:.2f} | {a['ops']} / {b['ops']} "
              f"| {a['allocations']} / {b['allocations']} |")


if __name__ == "__main__":
    main()
