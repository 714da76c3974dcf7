// A hand-written libtorch loop that trains a bf16 model with stochastic rounding: no Learner,
// only mixtrain::optim::AdamW (torch's AdamW class, stepping through mixtrain's optimizer
// core) in place of torch::optim::AdamW. A LayerNorm MLP is
// pretrained in fp32, then fine-tuned at a small learning rate three ways from the same
// weights and batches: in fp32, in bf16 rounded to nearest (what a bf16 model under a plain
// optimizer does: most updates round to nothing) and in bf16 rounded stochastically; and a fourth
// time rounded to nearest with the LayerNorm kept in fp32 by mixtrain::amp::keep_fp32 (an island in
// a bf16-stored model), which shows that an island for the norm alone is not this stall's cure.
//
//   bf16_own_loop_example [steps]
//
// The bf16 runs are real bf16 tensors: weights, gradients and AdamW's moments (8 bytes a
// parameter); each update is computed in fp32 and rounded once. Prints each run's validation loss, the share of updates
// the nearest run lost and each bf16 run's share of fp32's progress; exits 1 unless stochastic
// rounding makes more than 95% of fp32's progress where nearest makes less than 80%.
#include <mixtrain/amp/fp32_islands.h>
#include <mixtrain/amp/weight_update.h>
#include <mixtrain/optim/optimizers.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(16, 64))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({64})))),
        fc2(register_module("fc2", torch::nn::Linear(64, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(norm(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

struct Data {
  torch::Tensor x, y;
};

/// A classification task from a fixed teacher; `shift` moves its decision a little (the fine-tune).
Data make_data(int64_t n, uint64_t seed, double shift) {
  torch::manual_seed(7);  // one teacher for every split
  const torch::Tensor teacher = torch::randn({16, 4});
  torch::manual_seed(seed);
  torch::Tensor x = torch::randn({n, 16});
  return {x, (x.matmul(teacher) + shift * x.narrow(1, 0, 4)).argmax(1)};
}

double valid_loss(Net& net, const Data& d) {
  torch::NoGradGuard no_grad;
  net->eval();
  const double loss = torch::nn::functional::cross_entropy(net->forward(d.x), d.y).item<double>();
  net->train();
  return loss;
}

/// One fine-tune from `start`: `rule` empty trains fp32 under torch's AdamW; else a real bf16
/// model (weights, gradients and AdamW's moments all bf16 tensors) under mixtrain's AdamW,
/// which computes each update in fp32 and writes it back once by the rule.
double fine_tune(const std::vector<torch::Tensor>& start, const Data& train, const Data& valid, int steps,
                 const mixtrain::amp::WeightUpdate* rule, double* lost_share, bool norm_in_fp32 = false) {
  Net net;
  {
    torch::NoGradGuard no_grad;
    auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(start[i]);
  }
  const auto options = torch::optim::AdamWOptions(3e-4).weight_decay(0);
  std::unique_ptr<torch::optim::Optimizer> opt;
  mixtrain::optim::AdamW* ours = nullptr;
  std::unique_ptr<mixtrain::amp::Fp32Islands> islands;
  if (rule) {
    net->to(torch::kBFloat16);  // a bf16 model, as a Hugging Face model loaded in bfloat16
    // The LayerNorm as an fp32 island: its gains and biases fp32 tensors, its op computed in
    // fp32 and handing bf16 on (the guard lives for the whole loop).
    if (norm_in_fp32) islands = mixtrain::amp::keep_fp32(*net, {"norm"});
    auto made = std::make_unique<mixtrain::optim::AdamW>(net->parameters(), options,
                                                         mixtrain::optim::Rounding().weight_update(*rule).seed(42));
    ours = made.get();
    opt = std::move(made);
  } else {
    opt = std::make_unique<torch::optim::AdamW>(net->parameters(), options);
  }
  const torch::Dtype dtype = rule ? torch::kBFloat16 : torch::kFloat;
  const int64_t bs = 16;
  for (int step = 0; step < steps; ++step) {
    const int64_t at = (step * bs) % train.x.size(0);
    opt->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(train.x.narrow(0, at, bs).to(dtype)).to(torch::kFloat),
                                         train.y.narrow(0, at, bs))
        .backward();
    opt->step();
  }
  if (ours && lost_share) *lost_share = ours->lost_updates().fraction();
  islands.reset();  // the island's tensors back to bf16 (rounded), as the model was
  net->to(torch::kFloat);  // the bf16 weights, exactly, for the fp32 validation
  return valid_loss(net, valid);
}

} // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 400;
  if (steps < 1) {
    std::fprintf(stderr, "bf16_own_loop_example: steps must be a positive number, got '%s'\n", argv[1]);
    return 2;
  }
  torch::set_num_threads(1);
  // Pretraining in fp32: the weights every fine-tune starts from.
  const Data pretrain = make_data(4096, 1, 0.0), train = make_data(4096, 2, 0.8), valid = make_data(1024, 3, 0.8);
  torch::manual_seed(0);
  Net pre;
  {
    torch::optim::AdamW opt(pre->parameters(), torch::optim::AdamWOptions(3e-3));
    for (int step = 0; step < 400; ++step) {
      const int64_t at = (step * 32) % pretrain.x.size(0);
      opt.zero_grad();
      torch::nn::functional::cross_entropy(pre->forward(pretrain.x.narrow(0, at, 32)), pretrain.y.narrow(0, at, 32)).backward();
      opt.step();
    }
  }
  std::vector<torch::Tensor> start;
  for (const auto& p : pre->parameters()) start.push_back(p.detach().clone());
  const double before = valid_loss(pre, valid);

  const auto nearest = mixtrain::amp::WeightUpdate::kNearest, stochastic = mixtrain::amp::WeightUpdate::kStochastic;
  double lost_nearest = 0, lost_stochastic = 0, lost_island = 0;
  const double fp32 = fine_tune(start, train, valid, steps, nullptr, nullptr);
  const double bf16_nearest = fine_tune(start, train, valid, steps, &nearest, &lost_nearest);
  const double bf16_stochastic = fine_tune(start, train, valid, steps, &stochastic, &lost_stochastic);
  const double bf16_island = fine_tune(start, train, valid, steps, &nearest, &lost_island, /*norm_in_fp32=*/true);
  std::printf("validation loss before the fine-tune %.4f; after %d steps: fp32 %.4f, bf16 nearest %.4f (%.1f%% of "
              "its updates rounded to nothing), bf16 stochastic %.4f\n",
              before, steps, fp32, bf16_nearest, 100 * lost_nearest, bf16_stochastic);
  // Progress from the same start, as the doctor measures it.
  const double progress = before - fp32;
  const double share_nearest = (before - bf16_nearest) / progress, share_stochastic = (before - bf16_stochastic) / progress;
  std::printf("of fp32's progress: bf16 nearest %.1f%%, bf16 stochastic %.1f%%\n", 100 * share_nearest,
              100 * share_stochastic);
  std::printf("bf16 nearest with the LayerNorm kept in fp32 (mixtrain::amp::keep_fp32): %.4f, %.1f%% of fp32's "
              "progress (%.1f%% of the bf16 weights' updates rounded to nothing)\n",
              bf16_island, 100 * (before - bf16_island) / progress, 100 * lost_island);
  const bool cured = share_stochastic > 0.95 && share_nearest < 0.8;
  std::printf("stochastic rounding %s the stall\n", cured ? "cures" : "does NOT cure");
  return cured ? 0 : 1;
}
