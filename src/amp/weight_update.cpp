#include "mixtrain/amp/weight_update.h"

#include "mixtrain/amp/reduced_precision_emulation.h"

#include <ATen/Parallel.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mixtrain::amp {

const std::vector<std::pair<std::string, WeightUpdate>>& weight_update_names() {
  static const std::vector<std::pair<std::string, WeightUpdate>> kNames = {
      {"nearest", WeightUpdate::kNearest}, {"stochastic", WeightUpdate::kStochastic}, {"kahan", WeightUpdate::kKahan}};
  return kNames;
}

std::string weight_update_name(WeightUpdate rule) {
  for (const auto& [name, r] : weight_update_names())
    if (r == rule) return name;
  TORCH_INTERNAL_ASSERT(false, "unknown WeightUpdate ", static_cast<int>(rule));
}

LostUpdates& LostUpdates::operator+=(const LostUpdates& o) {
  elements += o.elements;
  intended += o.intended;
  lost += o.lost;
  intended_sq += o.intended_sq;
  lost_sq += o.lost_sq;
  return *this;
}

double LostUpdates::norm_ratio() const { return intended_sq > 0 ? std::sqrt(lost_sq / intended_sq) : 0.0; }

namespace {

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

bool is_nan_bits(uint32_t b) { return (b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0; }

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

} // namespace

float round_bf16_nearest(float x) {
  const uint32_t b = bits_of(x);
  if (is_nan_bits(b)) return float_of(0x7fc00000u);  // torch's canonical bf16 NaN
  return float_of((b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u);
}

float round_bf16_stochastic(float x, uint32_t r) {
  const uint32_t b = bits_of(x);
  if ((b & 0x7f800000u) == 0x7f800000u) return round_bf16_nearest(x);  // inf and NaN stay what they are
  // Adding r below the kept bits carries into them with probability (low bits) / 2^16.
  return float_of((b + (r & 0xffffu)) & 0xffff0000u);
}

namespace {
/// The key of one (seed, stream): computed once per tensor and step.
uint64_t stream_key(uint64_t seed, uint64_t stream) { return splitmix64(seed ^ splitmix64(stream)); }
/// The 64 random bits elements 4k .. 4k+3 share.
uint64_t draw(uint64_t key, uint64_t index) { return splitmix64(key ^ (index >> 2)); }
uint32_t quarter(uint64_t h, uint64_t index) { return static_cast<uint32_t>(h >> (16 * (index & 3))) & 0xffffu; }
} // namespace

uint32_t stochastic_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  // Four elements share one 64-bit draw: element i takes its quarter.
  return quarter(draw(stream_key(seed, stream), index), index);
}

namespace {

// One rule's pass over [lo, hi): the rule is a template argument so that the loop
// has no branch on it, and the counts and sums are branch-free, which lets the
// compiler vectorize the nearest and Kahan passes. Sums run in float within a
// chunk (at most 32768 terms) and in double across chunks.
template <WeightUpdate kRule>
LostUpdates round_span(float* w, const float* before, float* comp, int64_t lo, int64_t hi, uint64_t seed,
                       uint64_t stream) {
  int64_t intended = 0, lost = 0;
  float intended_sq = 0, lost_sq = 0;
  const uint64_t key = kRule == WeightUpdate::kStochastic ? stream_key(seed, stream) : 0;
  uint64_t bits = 0;
  for (int64_t i = lo; i < hi; ++i) {
    const float old = before[i], fresh = w[i];
    const float u = fresh - old;  // the optimizer's update, as fp32 computed it
    float out, dropped;
    if constexpr (kRule == WeightUpdate::kNearest) {
      out = round_bf16_nearest(fresh);
      dropped = fresh - out;
    } else if constexpr (kRule == WeightUpdate::kStochastic) {
      const auto index = static_cast<uint64_t>(i);
      if (i == lo || (index & 3) == 0) bits = draw(key, index);  // one draw serves four elements
      out = round_bf16_stochastic(fresh, quarter(bits, index));
      dropped = fresh - out;
    } else {
      const float target = old + (u + comp[i]);  // the update plus what earlier roundings dropped
      out = round_bf16_nearest(target);
      const float rest = target - out;  // exact: out is target's nearest neighbour
      comp[i] = round_bf16_nearest(rest);
      dropped = rest - comp[i];
    }
    w[i] = out;
    const bool moved_meant = u != 0;
    intended += moved_meant;
    lost += moved_meant & (out == old);
    intended_sq += u * u;
    lost_sq += dropped * dropped;
  }
  LostUpdates s;
  s.elements = hi - lo;
  s.intended = intended;
  s.lost = lost;
  s.intended_sq = intended_sq;
  s.lost_sq = lost_sq;
  return s;
}

LostUpdates round_span(float* w, const float* before, float* comp, int64_t lo, int64_t hi, WeightUpdate rule,
                       uint64_t seed, uint64_t stream) {
  switch (rule) {
    case WeightUpdate::kNearest: return round_span<WeightUpdate::kNearest>(w, before, comp, lo, hi, seed, stream);
    case WeightUpdate::kStochastic: return round_span<WeightUpdate::kStochastic>(w, before, comp, lo, hi, seed, stream);
    case WeightUpdate::kKahan: break;
  }
  return round_span<WeightUpdate::kKahan>(w, before, comp, lo, hi, seed, stream);
}

LostUpdates round_cpu(float* w, const float* before, float* comp, int64_t n, WeightUpdate rule, uint64_t seed,
                      uint64_t stream) {
  // Fixed chunks summed in order: the counts and norms do not depend on the thread count.
  constexpr int64_t kChunk = 1 << 15;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<LostUpdates> parts(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      parts[static_cast<size_t>(c)] = round_span(w, before, comp, c * kChunk, std::min(n, (c + 1) * kChunk), rule, seed, stream);
  });
  LostUpdates total;
  for (const auto& p : parts) total += p;
  return total;
}

} // namespace

LostUpdates round_update(torch::Tensor& weight, const torch::Tensor& before, WeightUpdate rule,
                         torch::Tensor* compensation, uint64_t seed, uint64_t stream) {
  TORCH_CHECK(weight.scalar_type() == torch::kFloat && before.scalar_type() == torch::kFloat,
              "round_update: the weight and its old value must be fp32 storage, got ", weight.scalar_type(), " and ",
              before.scalar_type());
  TORCH_CHECK(weight.sizes() == before.sizes(), "round_update: the old value's shape ", before.sizes(),
              " is not the weight's ", weight.sizes());
  const bool kahan = rule == WeightUpdate::kKahan;
  TORCH_CHECK(!kahan || (compensation && compensation->scalar_type() == torch::kFloat &&
                         compensation->sizes() == weight.sizes()),
              "round_update: kahan needs an fp32 compensation of the weight's shape");
  torch::NoGradGuard no_grad;
  if (weight.is_cpu() && weight.is_contiguous() && before.is_contiguous() &&
      (!kahan || (compensation->is_cpu() && compensation->is_contiguous()))) {
    return round_cpu(weight.data_ptr<float>(), before.data_ptr<float>(), kahan ? compensation->data_ptr<float>() : nullptr,
                     weight.numel(), rule, seed, stream);
  }
  // Another device, or a strided tensor: the same pass on contiguous host copies.
  torch::Tensor w = weight.to(torch::kCPU).contiguous(), b = before.to(torch::kCPU).contiguous();
  torch::Tensor c = kahan ? compensation->to(torch::kCPU).contiguous() : torch::Tensor();
  const LostUpdates s = round_cpu(w.data_ptr<float>(), b.data_ptr<float>(), kahan ? c.data_ptr<float>() : nullptr,
                                  w.numel(), rule, seed, stream);
  weight.copy_(w);
  if (kahan) compensation->copy_(c);
  return s;
}

void round_to_bf16_(torch::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat, "round_to_bf16_: an fp32 tensor, got ", t.scalar_type());
  torch::NoGradGuard no_grad;
  if (t.is_cpu() && t.is_contiguous()) {
    round_floats(t.data_ptr<float>(), t.data_ptr<float>(), t.numel(), torch::kBFloat16);
    return;
  }
  t.copy_(t.to(torch::kBFloat16));
}

} // namespace mixtrain::amp
