// What diagnose::Watch costs a hand-written libtorch loop: whole steps (forward, backward, the
// update, the scaler), each loop unwatched, watched with the default sampling (every=100: one
// sampled step and one read per 100 steps) and with every step sampled (every=1: the cost of a
// sampled step, the op tracer on its forward), plus a second unwatched arm for this machine's
// noise. Interleaved rounds, each with a new watch; medians compared. The goals: at
// most 1.02x with the default sampling, at most 1.5x for a sampled step.
//
//   watch_bench [STEPS] [ROUNDS] [TORCHSCRIPT_FILE]
// The loops: the built-in CNN (bs 64) in fp16 autocast with amp::GradScaler and libtorch's
// AdamW; the built-in transformer (bs 16 x 64 tokens) stored in bf16 under mixtrain::optim's
// AdamW (its exact lost-update count) and under libtorch's AdamW (counted on sampled steps
// against a copy of the weights); and, given a file, a TorchScript model taking
// [N, 3, 32, 32] images (tests/python/export_torchvision.py's ViT) as the CNN's loop runs it.
#include <mixtrain/mixtrain.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Loop {
  std::string name;
  std::function<mixtrain::Model()> build;
  bool fp16_scaled;   // fp16 autocast + GradScaler (else a bf16 model, no scaler)
  bool ours = true;   // a bf16 model: mixtrain::optim's AdamW (else libtorch's, counted by copy)
  bool tokens;        // the transformer's data
  std::vector<int64_t> image;  // an image's shape
  int64_t bs;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 100;
  const int64_t rounds = argc > 2 ? std::atoll(argv[2]) : 3;
  const std::string scripted = argc > 3 ? argv[3] : "";
  mixtrain::configure_threads(0, mixtrain::ThreadPolicy::kIntraOp);
  const mixtrain::WarningsTo quiet([](const mixtrain::Phrase&) {});  // a watch may warn: not timed

  std::vector<Loop> loops = {
      {"built-in CNN, fp16 autocast + GradScaler, libtorch AdamW (bs 64)",
       [] { return mixtrain::run::find_builtin_model("cnn")->build(); }, true, true, false, {1, 28, 28}, 64},
      {"built-in transformer stored in bf16, mixtrain::optim AdamW (bs 16 x 64 tokens)",
       [] { return mixtrain::run::find_builtin_model("transformer")->build(); }, false, true, true, {}, 16},
      {"built-in transformer stored in bf16, libtorch AdamW (bs 16 x 64 tokens)",
       [] { return mixtrain::run::find_builtin_model("transformer")->build(); }, false, false, true, {}, 16}};
  if (!scripted.empty())
    loops.push_back({"TorchScript " + scripted + ", fp16 autocast + GradScaler, libtorch AdamW (bs 64)",
                     [scripted] { return mixtrain::load_scripted_model(scripted); }, true, true, false, {3, 32, 32}, 64});

  std::printf("diagnose::Watch's cost, %lld steps a round, %lld rounds, %d threads\n", static_cast<long long>(steps),
              static_cast<long long>(rounds), torch::get_num_threads());
  const std::vector<std::pair<std::string, int64_t>> arms = {
      {"unwatched", 0}, {"watched, every=100", 100}, {"every step sampled", 1}, {"unwatched again", 0}};
  for (const Loop& loop : loops) {
    torch::manual_seed(0);
    std::vector<torch::Tensor> xs, ys;
    for (int64_t i = 0; i < steps; ++i) {
      if (loop.tokens) {
        xs.push_back(torch::randint(0, 256, {loop.bs, 64}));
        ys.push_back(torch::randint(0, 256, {loop.bs, 64}));
      } else {
        std::vector<int64_t> shape{loop.bs};
        shape.insert(shape.end(), loop.image.begin(), loop.image.end());
        xs.push_back(torch::randn(shape));
        ys.push_back(torch::randint(0, 10, {loop.bs}));
      }
    }
    struct Arm {
      mixtrain::Model model;
      std::unique_ptr<torch::optim::Optimizer> opt;
      std::unique_ptr<mixtrain::amp::GradScaler> scaler;
    };
    std::map<std::string, Arm> state;
    for (const auto& [arm, every] : arms) {
      torch::manual_seed(0);
      Arm a{loop.build(), nullptr, nullptr};
      if (loop.fp16_scaled) {
        a.opt = std::make_unique<torch::optim::AdamW>(a.model.module().parameters(), torch::optim::AdamWOptions(1e-4));
        a.scaler = std::make_unique<mixtrain::amp::GradScaler>();
      } else {
        a.model.module().to(torch::kBFloat16);
        if (loop.ours)
          a.opt = std::make_unique<mixtrain::optim::AdamW>(a.model.module().parameters(), torch::optim::AdamWOptions(1e-4));
        else
          a.opt = std::make_unique<torch::optim::AdamW>(a.model.module().parameters(), torch::optim::AdamWOptions(1e-4));
      }
      state.emplace(arm, std::move(a));
    }
    auto run_round = [&](const std::string& arm, int64_t every) {
      Arm& a = state.at(arm);
      std::optional<mixtrain::diagnose::Watch> watch;
      const auto t0 = Clock::now();
      if (every > 0) watch.emplace(a.model.module(), *a.opt, a.scaler.get(), mixtrain::diagnose::WatchOptions().every(every));
      for (int64_t i = 0; i < steps; ++i) {
        a.opt->zero_grad();
        torch::Tensor loss;
        if (loop.fp16_scaled) {
          {
            mixtrain::amp::autocast guard(torch::kCPU, torch::kHalf);
            loss = torch::nn::functional::cross_entropy(a.model(xs[i]).to(torch::kFloat), ys[i]);
          }
          a.scaler->scale(loss).backward();
          a.scaler->step(*a.opt);
          a.scaler->update();
        } else {
          const torch::Tensor logits = a.model(xs[i]).to(torch::kFloat);
          loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), ys[i].reshape({-1}));
          loss.backward();
          a.opt->step();
        }
        if (watch) watch->after_step();
      }
      if (watch) watch->close();  // the last read: part of the cost
      return std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(steps);
    };
    for (const auto& [arm, every] : arms) run_round(arm, every);  // warm-up
    std::map<std::string, std::vector<double>> times;
    for (int64_t r = 0; r < rounds; ++r)
      for (const auto& [arm, every] : arms) times[arm].push_back(run_round(arm, every));
    int64_t params = 0;
    for (const auto& p : state.at("unwatched").model.module().parameters()) params += p.numel();
    std::printf("  %s, %lld parameters\n", loop.name.c_str(), static_cast<long long>(params));
    const double base = median(times["unwatched"]);
    for (const auto& [arm, every] : arms) {
      const double t = median(times[arm]);
      std::printf("    %-22s %8.2f ms a step  %.3fx\n", arm.c_str(), 1e3 * t, t / base);
    }
  }
  return 0;
}
