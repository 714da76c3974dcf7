#pragma once
/// How a 16-bit weight takes an update computed in fp32, and what rounding threw
/// away. The update pass of bf16-pure training (amp/pure_bf16.h): the optimizer
/// computes the new weight in fp32 from the bf16 weight, gradient and state, and
/// round_update() rounds it back to bf16 once, counting in the same pass the
/// elements whose update rounded to nothing.
///
/// An update smaller than half a unit in the last place of its weight is lost to
/// nearest rounding: in bf16 that is |dw| < about |w| / 256, so a LayerNorm gain
/// of 1.0 trained by Adam at a small learning rate never moves. Stochastic
/// rounding keeps such updates in expectation; a Kahan compensation carries the
/// dropped part into the next step.
///
/// Example (a hand-written loop):
///   torch::Tensor before = w.detach().clone();       // bf16 values in fp32 storage
///   opt.step();                                       // the fp32 update, in place
///   auto lost = mixtrain::amp::round_update(w, before, mixtrain::amp::WeightUpdate::kStochastic,
///                                           nullptr, /*seed=*/42, /*stream=*/step);

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class OptimizerParamState;
} // namespace torch::optim

namespace mixtrain::amp {

/// How an fp32 result is rounded back to a 16-bit weight.
enum class WeightUpdate {
  kNearest,     ///< "nearest": round to nearest even, what plain bf16 storage does
  kStochastic,  ///< "stochastic": up or down with probability in proportion to the distance; seeded
  kKahan,       ///< "kahan": nearest, with a 16-bit compensation that carries the dropped part to the next step
};
/// Every rule with its name, in help's order: the one place the names are written.
const std::vector<std::pair<std::string, WeightUpdate>>& weight_update_names();
std::string weight_update_name(WeightUpdate rule);

/// What rounding did to the updates of a tensor (or a sum of them).
struct LostUpdates {
  int64_t elements = 0;     ///< elements updated
  int64_t intended = 0;     ///< of which the fp32 update was nonzero
  int64_t lost = 0;         ///< of those, the ones whose weight rounded back to its old value
  double intended_sq = 0;   ///< sum of the squared fp32 updates
  double lost_sq = 0;       ///< sum of the squared parts rounding dropped (kahan: what its compensation could not carry)
  LostUpdates& operator+=(const LostUpdates& other);
  /// lost / intended (0 when nothing was intended).
  double fraction() const { return intended > 0 ? static_cast<double>(lost) / static_cast<double>(intended) : 0.0; }
  /// |dropped| / |intended| over the elements.
  double norm_ratio() const;
};

/// Rounds an fp32 value to the nearest bfloat16, ties to even, NaN kept: bitwise
/// what `.to(torch::kBFloat16)` gives, returned in fp32.
float round_bf16_nearest(float x);
/// Rounds up or down to a neighbouring bfloat16 using 16 random bits `r`: up with
/// probability (x - lower) / (upper - lower), so the mean over r is x.
float round_bf16_stochastic(float x, uint32_t r);
/// The 16 random bits element `index` of stream `stream` draws under `seed`: a
/// counter-based hash, so every rank, thread count and resume draws the same bits.
uint32_t stochastic_bits(uint64_t seed, uint64_t stream, uint64_t index);
/// The stream of parameter `param` (its index in the model or optimizer) at `step`: one
/// per parameter and step, what bf16-pure and mixtrain's optimizers round with.
inline uint64_t stochastic_stream(int64_t step, size_t param) {
  return static_cast<uint64_t>(step) * 0x100000001b3ull + static_cast<uint64_t>(param);
}

/// Rounds `weight` (fp32 storage, the optimizer's fp32 result) to bf16 values in
/// place by `rule`, given `before` (its bf16 values before the step, same shape),
/// and counts what was lost. kKahan needs `compensation` (fp32 storage of bf16
/// values, same shape), read and updated; kStochastic draws stochastic_bits(seed,
/// stream, i) for element i. CPU tensors are rounded in one threaded pass; other
/// devices go through the host (correct, not fast). Throws c10::Error for tensors
/// that are not fp32 or do not match.
LostUpdates round_update(torch::Tensor& weight, const torch::Tensor& before, WeightUpdate rule,
                         torch::Tensor* compensation, uint64_t seed, uint64_t stream);

/// round_update's chunk: the pass runs over chunks of this many elements, each counted
/// on its own and summed in order (so the counts do not depend on the thread count).
constexpr int64_t kUpdateChunk = int64_t{1} << 15;

/// round_update's pass on one span of a weight, single-threaded: `n` contiguous values
/// that are elements [first, first + n) of the weight (their stochastic bits are those
/// elements'), `first` a multiple of 8. Spans of kUpdateChunk elements at multiples of
/// it give round_update's counts bitwise. The optimizer core (optim/update_rule.h)
/// calls it on each chunk of a 16-bit weight it has widened to fp32.
LostUpdates round_update_span(float* weight, const float* before, float* compensation, int64_t n, uint64_t first,
                              WeightUpdate rule, uint64_t seed, uint64_t stream);

/// Rounds an fp32 tensor to bf16 values in place (nearest): a weight or an
/// optimizer state written in 16 bits.
void round_to_bf16_(torch::Tensor& t);


} // namespace mixtrain::amp
