// One BatchNorm2d training forward on the built-in CNN's two activations ([256, 16, 14, 14]
// and [256, 32, 7, 7], fp32, CPU): models::BatchNorm2d against torch::nn::BatchNorm2d, at 1
// and 2 threads; the best of 7 rounds of 20 forwards each, interleaved. The outputs are
// compared bit for bit first (tests/batch_norm_test.cpp holds that; this says it again for the
// machine the numbers come from). bench/batch_norm_bench.sh runs it.
#include <mixtrain/models/batch_norm.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

/// The best mean time of one forward (ms) over `rounds` rounds of `reps` forwards.
template <typename Module>
double best_forward_ms(Module& bn, const torch::Tensor& x, int rounds, int reps) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) bn->forward(x);
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / reps);
  }
  return best;
}

} // namespace

int main() {
  torch::manual_seed(0);
  const torch::NoGradGuard no_grad;
  for (const int threads : {1, 2}) {
    torch::set_num_threads(threads);
    for (const std::vector<int64_t> shape : {std::vector<int64_t>{256, 16, 14, 14}, std::vector<int64_t>{256, 32, 7, 7}}) {
      mixtrain::models::BatchNorm2d ours(shape[1]);
      torch::nn::BatchNorm2d theirs(shape[1]);
      const torch::Tensor x = torch::randn(shape) * 3 + 1.5;
      const bool fast = mixtrain::models::batch_norm_fast_path_applies(*ours, x);
      const bool same = torch::equal(ours->forward(x), theirs->forward(x)) &&
                        torch::equal(ours->running_var, theirs->running_var);
      double ours_ms = 1e30, theirs_ms = 1e30;
      for (int round = 0; round < 3; ++round) {  // interleaved: the machine's state moves
        ours_ms = std::min(ours_ms, best_forward_ms(ours, x, 7, 20));
        theirs_ms = std::min(theirs_ms, best_forward_ms(theirs, x, 7, 20));
      }
      std::printf("%d thread(s), [%ld, %ld, %ld, %ld]: models::BatchNorm2d %.3f ms, torch's %.3f ms, ratio %.3f "
                  "(fast path %s, bits %s)\n",
                  threads, shape[0], shape[1], shape[2], shape[3], ours_ms, theirs_ms, ours_ms / theirs_ms,
                  fast ? "on" : "off", same ? "equal" : "DIFFERENT");
    }
  }
}
