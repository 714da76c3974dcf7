// Master-weights copy overhead per step, with and without flat_master, on a
// model with many parameter tensors (61 Linear layers = 122 tensors), bf16.
// The copy work is MasterWeights' before_step (inf check, grads -> masters,
// unscale) plus its after_step (masters -> model), timed by callbacks placed
// just before and after it; reported as a fraction of the whole step.
#include <mixtrain/mixtrain.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// Accumulates the time between a callback at order 9 and one at order 11 (MasterWeights is 10).
struct Timer {
  double copy = 0, batch = 0, mark = 0, batch_start = 0;
};
struct Before : mixtrain::Callback {
  Timer* t;
  explicit Before(Timer* t) : t(t) { order = 9; }
  void before_batch(mixtrain::Learner& l) override { if (l.training()) t->batch_start = now(); }
  void before_step(mixtrain::Learner&) override { t->mark = now(); }
  void after_step(mixtrain::Learner&) override { t->mark = now(); }
};
struct After : mixtrain::Callback {
  Timer* t;
  explicit After(Timer* t) : t(t) { order = 11; }
  void before_step(mixtrain::Learner&) override { t->copy += now() - t->mark; }
  void after_step(mixtrain::Learner&) override { t->copy += now() - t->mark; }
  void after_batch(mixtrain::Learner& l) override { if (l.training()) t->batch += now() - t->batch_start; }
};
} // namespace

int main() {
  mixtrain::configure_threads(0);
  auto x = torch::randn({4096, 128}), y = torch::randint(10, {4096});
  auto dls = mixtrain::data::DataLoaders::from_split({{x, y}, {x.slice(0, 0, 256), y.slice(0, 0, 256)}}, 256, 0);
  for (int round = 0; round < 2; ++round) {  // round 0 warms up
    for (bool flat : {false, true}) {
      torch::manual_seed(0);
      torch::nn::Sequential model;
      for (int i = 0; i < 60; ++i) {
        model->push_back(torch::nn::Linear(128, 128));
        model->push_back(torch::nn::ReLU());
      }
      model->push_back(torch::nn::Linear(128, 10));
      mixtrain::Learner learn(model, dls, mixtrain::cross_entropy(), mixtrain::LearnerOptions().progress(false));
      learn.to_half(mixtrain::amp::MasterWeightsOptions().dtype(torch::kBFloat16).flat_master(flat));
      Timer t;
      learn.add_cb(std::make_shared<Before>(&t)).add_cb(std::make_shared<After>(&t));
      const double t0 = now();
      learn.fit(3, 1e-3);
      const double total = now() - t0;
      const auto steps = static_cast<double>(learn.recorder().steps().size());
      if (round == 1)
        std::printf("%-17s %zu param tensors: step %.2f ms, master copies %.2f ms/step = %.1f%% of the step (fit %.2f s)\n",
                    flat ? "flat_master" : "per-param masters", model->parameters().size(), 1e3 * t.batch / steps,
                    1e3 * t.copy / steps, 100 * t.copy / t.batch, total);
    }
  }
  return 0;
}
