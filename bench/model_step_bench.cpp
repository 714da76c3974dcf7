// Training-step time of a model in a mixtrain Learner (fit, one epoch of random
// data, progress off), for bench/model_bench.sh: the built-in models, or a
// TorchScript file. Prints one line: "<what> step_ms X".
//
//   model_step_bench MODEL STEPS BATCH [PRECISION] [torch|core]
// MODEL: cnn | resnet | transformer | a TorchScript file taking [N, 1, 28, 28] images.
// PRECISION: any mode's name (fp32 by default). The optimizer: libtorch's AdamW (torch, the
// default), or mixtrain::optim's (core), which `mixtrain train` runs in every mode and which
// gives bf16-pure its bf16 tensors on a real bf16 forward.
#include "bench_learner.h"

#include <mixtrain/mixtrain.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {
/// Times the training steps after the warm-up ones (the first steps allocate).
class StepTimer : public mixtrain::Callback {
 public:
  explicit StepTimer(int64_t warmup) : warmup_(warmup) {}
  void before_batch(mixtrain::Learner& learn) override {
    if (learn.training() && learn.train_iter() == warmup_) start_ = std::chrono::steady_clock::now();
  }
  void after_batch(mixtrain::Learner& learn) override {
    if (!learn.training() || learn.train_iter() <= warmup_) return;
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    steps_ = learn.train_iter() - warmup_;
  }
  double ms_per_step() const { return 1000 * seconds_ / static_cast<double>(steps_); }

 private:
  int64_t warmup_, steps_ = 0;
  double seconds_ = 0;
  std::chrono::steady_clock::time_point start_;
};
} // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL STEPS BATCH [PRECISION] [torch|core]\n", argv[0]);
    return 2;
  }
  return bench::run_guarded(argv[0], [&] {
    const std::string name = argv[1];
    const int64_t steps = std::atoll(argv[2]), bs = std::atoll(argv[3]);
    const std::string precision = argc > 4 ? argv[4] : "fp32";
    const bool core = argc > 5 && std::string(argv[5]) == "core";
    // 3 warm-up steps, not timed (as bench/python_transformer.py).
    const auto learn = bench::step_bench_learner(name, steps + 3, bs, precision, core, std::getenv("MIXTRAIN_BENCH_THREADS"));
    auto timer = std::make_shared<StepTimer>(3);
    learn->fit(1, 1e-3, {timer});
    std::printf("%s %s%s step_ms %.2f\n", name.c_str(), precision.c_str(), core ? " core" : "", timer->ms_per_step());
    return 0;
  });
}
