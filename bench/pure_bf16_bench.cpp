// bf16-pure against fp32 and bf16 autocast on the same MLP-with-LayerNorm steps,
// the weight-update rules against nearest, and the lost-update counting pass
// against a plain rounding pass. Every figure is a ratio measured in this run
// (this machine is noisy; each arm runs three times and keeps its best).
#include "layer_norm_mlp.h"

#include <mixtrain/mixtrain.h>
#include <mixtrain/optim/optimizers.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }


/// One arm: a Learner in one mode, kept across rounds so that arms interleave
/// (the host's speed drifts over minutes; interleaving keeps the ratios fair).
struct Arm {
  std::unique_ptr<mixtrain::Learner> learn;
  double best_ms = 1e300;
};

/// `core`: mixtrain::optim's AdamW (the run layer's; bf16-pure then stores bf16 tensors on a
/// real forward) instead of libtorch's.
Arm make_arm(const torch::Tensor& x, const torch::Tensor& y, mixtrain::Precision precision,
             mixtrain::amp::WeightUpdate rule, bool core = false) {
  torch::manual_seed(0);
  LayerNormMlp net(512, 512, 4, 10);
  auto dls = mixtrain::data::DataLoaders::from_split({{x, y}, {x.slice(0, 0, 256), y.slice(0, 0, 256)}}, 256, 0);
  Arm arm;
  auto options = mixtrain::LearnerOptions().progress(false);
  if (core) options.opt_func(mixtrain::optim::factory(mixtrain::OptimizerSettings(), mixtrain::optim::Rounding().weight_update(rule)));
  arm.learn = std::make_unique<mixtrain::Learner>(mixtrain::Model(net), dls, mixtrain::cross_entropy(), options);
  arm.learn->set_precision(precision, mixtrain::PrecisionOptions().weight_update(rule).rounding_seed(1));
  arm.learn->fit(1, 1e-4);  // warm: the first fit allocates the optimizer's state
  return arm;
}

/// Milliseconds per training step of one more fit of `arm`, kept when it is its best.
void time_fit(Arm& arm) {
  const double t0 = now();
  arm.learn->fit(1, 1e-4);
  arm.best_ms = std::min(arm.best_ms, 1e3 * (now() - t0) / static_cast<double>(arm.learn->dls().train.num_batches()));
}

} // namespace

/// One arm's mode, rule and optimizer (see make_arm).
struct ArmSpec {
  mixtrain::Precision precision;
  mixtrain::amp::WeightUpdate rule = mixtrain::amp::WeightUpdate::kNearest;
  bool core = false;
};

/// The best milliseconds per step of each arm, on the forward `cpu_bf16` picks
/// (MIXTRAIN_CPU_BF16: "1" real, "0" emulated), the arms fitting in turn for 9 rounds.
std::vector<double> best_step_ms(const char* cpu_bf16, const std::vector<ArmSpec>& specs) {
  ::setenv("MIXTRAIN_CPU_BF16", cpu_bf16, 1);
  mixtrain::configure_threads(0);
  auto x = torch::randn({4096, 512}), y = torch::randint(10, {4096});
  std::vector<Arm> arms;
  for (const auto& spec : specs) arms.push_back(make_arm(x, y, spec.precision, spec.rule, spec.core));
  for (int round = 0; round < 9; ++round)
    for (auto& arm : arms) time_fit(arm);
  std::vector<double> best;
  for (const auto& arm : arms) best.push_back(arm.best_ms);
  return best;
}

/// `pure_bf16_bench storage`: on the real bf16 forward, bf16-pure's two storages against
/// each other and against fp32, each stepped the way it is in use: fp32 tensors of bf16
/// values with libtorch's AdamW and the rounding pass after it (a C++ Learner's default),
/// bf16 tensors with mixtrain::optim's AdamW (the run layer's), fp32 with the latter.
int storage_main() {
  using mixtrain::Precision;
  using mixtrain::amp::WeightUpdate;
  const auto best = best_step_ms("1", {{Precision::kFp32, WeightUpdate::kNearest, /*core=*/true},
                                       {Precision::kBf16Pure, WeightUpdate::kNearest, /*core=*/false},
                                       {Precision::kBf16Pure, WeightUpdate::kNearest, /*core=*/true}});
  const double fp32 = best[0], fp32_storage = best[1], bf16_storage = best[2];
  std::printf("real bf16 forward, step (4x Linear(512)+LayerNorm, bs 256): fp32 %.2f ms, bf16-pure on fp32 tensors %.2f ms, "
              "on bf16 tensors %.2f ms\n",
              fp32, fp32_storage, bf16_storage);
  std::printf("bf16-pure on bf16 tensors / on fp32 tensors: %.2fx (goal <= 1.0); / fp32: %.2fx\n", bf16_storage / fp32_storage,
              bf16_storage / fp32);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "storage") == 0) return storage_main();
  // Every bf16 arm here is emulated, as on a CPU without bf16 units (written when libtorch 1.13's
  // real CPU path could not run a LayerNorm after a Linear; `storage` runs the real path).
  using mixtrain::Precision;
  using mixtrain::amp::WeightUpdate;
  const auto best = best_step_ms("0", {{Precision::kFp32}, {Precision::kBf16}, {Precision::kBf16Pure},
                                       {Precision::kBf16Pure, WeightUpdate::kStochastic},
                                       {Precision::kBf16Pure, WeightUpdate::kKahan}});
  const double fp32 = best[0], bf16 = best[1], nearest = best[2], stochastic = best[3], kahan = best[4];
  std::printf("step (4x Linear(512)+LayerNorm, bs 256): fp32 %.2f ms, bf16 %.2f ms, bf16-pure nearest %.2f ms\n", fp32,
              bf16, nearest);
  std::printf("bf16-pure step / fp32 step: %.2fx; / bf16 step: %.2fx\n", nearest / fp32, nearest / bf16);
  std::printf("stochastic / nearest: %.2fx (goal <= 1.10); kahan / nearest: %.2fx (goal <= 1.10)\n", stochastic / nearest,
              kahan / nearest);

  // The update pass alone on 4M weights: rounding with the lost-update counts
  // (round_update) against rounding without them (round_to_bf16_).
  torch::Tensor before = torch::randn({1 << 22}).to(torch::kBFloat16).to(torch::kFloat);
  const torch::Tensor fresh = before + torch::randn({1 << 22}) * 1e-3;
  double counted = 1e300, plain = 1e300;
  for (int rep = 0; rep < 7; ++rep) {
    torch::Tensor w = fresh.clone();
    double t0 = now();
    mixtrain::amp::round_update(w, before, WeightUpdate::kNearest, nullptr, 0, rep);
    counted = std::min(counted, now() - t0);
    w = fresh.clone();
    t0 = now();
    mixtrain::amp::round_to_bf16_(w);
    plain = std::min(plain, now() - t0);
  }
  // The step without counting: the counted pass's extra time, for this model's parameters, taken out.
  int64_t params = 0;
  for (const auto& p : LayerNormMlp(512, 512, 4, 10)->parameters()) params += p.numel();
  const double extra_ms = 1e3 * (counted - plain) * static_cast<double>(params) / static_cast<double>(1 << 22);
  std::printf("update pass on 4M weights: counting %.2f ms, not counting %.2f ms (%.2fx); the bf16-pure step with "
              "counting / without: %.3fx (goal <= 1.05)\n",
              1e3 * counted, 1e3 * plain, counted / plain, nearest / (nearest - extra_ms));
  return 0;
}
