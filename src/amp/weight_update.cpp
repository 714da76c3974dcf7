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

// The roundings themselves, inlined into the update pass: the public functions below are
// exported from a -fPIC library, so the compiler may not inline them (another definition
// could interpose) and a call per element kept the pass scalar, 9x a plain rounding pass.
inline float bf16_nearest(float x) {
  const uint32_t b = bits_of(x);
  const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  return float_of(is_nan_bits(b) ? 0x7fc00000u : rounded);  // NaN: torch's canonical bf16 NaN
}

inline float bf16_stochastic(float x, uint32_t r) {
  const uint32_t b = bits_of(x);
  // Adding r below the kept bits carries into them with probability (low bits) / 2^16;
  // inf and NaN are rounded to nearest, which keeps them what they are.
  const uint32_t carried = (b + (r & 0xffffu)) & 0xffff0000u;
  return (b & 0x7f800000u) == 0x7f800000u ? bf16_nearest(x) : float_of(carried);
}

} // namespace

float round_bf16_nearest(float x) { return bf16_nearest(x); }

float round_bf16_stochastic(float x, uint32_t r) { return bf16_stochastic(x, r); }

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

// One element of a rule's pass: the rounded weight goes to w[i], what it counts to lane j.
// The pass's tail (fewer than 8 elements) and the reference round_four keeps to.
struct Lanes {
  static constexpr int kWidth = 8;
  int32_t intended[kWidth] = {}, lost[kWidth] = {};
  float intended_sq[kWidth] = {}, lost_sq[kWidth] = {};
};

template <WeightUpdate kRule>
inline __attribute__((always_inline)) void round_one(float* w, const float* before, float* comp, int64_t i, uint32_t r,
                                                     Lanes& l, int j) {
  const float old = before[i], fresh = w[i];
  const float u = fresh - old;  // the optimizer's update, as fp32 computed it
  float out, dropped;
  if constexpr (kRule == WeightUpdate::kNearest) {
    out = bf16_nearest(fresh);
    dropped = fresh - out;
  } else if constexpr (kRule == WeightUpdate::kStochastic) {
    out = bf16_stochastic(fresh, r);
    dropped = fresh - out;
  } else {
    const float target = old + (u + comp[i]);  // the update plus what earlier roundings dropped
    out = bf16_nearest(target);
    const float rest = target - out;  // exact: out is target's nearest neighbour
    comp[i] = bf16_nearest(rest);
    dropped = rest - comp[i];
  }
  w[i] = out;
  const int32_t moved_meant = u != 0;
  l.intended[j] += moved_meant;
  l.lost[j] += moved_meant & static_cast<int32_t>(out == old);
  l.intended_sq[j] += u * u;
  l.lost_sq[j] += dropped * dropped;
}

// The same element rule four at a time, written with GCC/clang vector types: explicit
// SSE2 (16-byte vectors, which every x86-64 has, and whose compares and selects map to
// single instructions; a 32-byte vector without AVX was lowered element by element).
// Left to the auto-vectorizer, round_one's lanes took 1.15 ns an element (150k weights,
// 1 thread); this takes 0.47 ns. Lanes 0-3 and 4-7 are two accumulators of four, and
// lane j sums what element i = j (mod 8) counts in round_one's order: the results are
// the scalar pass's, bit for bit. Vector casts reinterpret bits.
using F4 = float __attribute__((vector_size(16)));
using U4 = uint32_t __attribute__((vector_size(16)));
using I4 = int32_t __attribute__((vector_size(16)));

struct Lanes4 {
  I4 intended = {}, lost = {};
  F4 intended_sq = {}, lost_sq = {};
};

inline __attribute__((always_inline)) F4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline __attribute__((always_inline)) void store4(float* p, F4 v) { std::memcpy(p, &v, sizeof v); }

inline __attribute__((always_inline)) F4 bf16_nearest4(F4 x) {
  const U4 b = (U4)x;
  const U4 rounded = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  // NaN: magnitude bits above inf's. Both sides are below 2^31, so a signed compare
  // (one SSE2 instruction; an unsigned one is not) says the same.
  const U4 nan = (U4)((I4)(b & 0x7fffffffu) > 0x7f800000);
  return (F4)((rounded & ~nan) | (nan & 0x7fc00000u));  // torch's canonical bf16 NaN
}

inline __attribute__((always_inline)) F4 bf16_stochastic4(F4 x, U4 bits) {
  const U4 b = (U4)x;
  const U4 carried = (b + (bits & 0xffffu)) & 0xffff0000u;
  const U4 special = (U4)((b & 0x7f800000u) == 0x7f800000u);  // inf and NaN round to nearest
  return (F4)((carried & ~special) | ((U4)bf16_nearest4(x) & special));
}

template <WeightUpdate kRule>
inline __attribute__((always_inline)) void round_four(float* w, const float* before, float* comp, int64_t i, U4 bits,
                                                      Lanes4& l) {
  const F4 old = load4(before + i), fresh = load4(w + i);
  const F4 u = fresh - old;  // the optimizer's update, as fp32 computed it
  F4 out, dropped;
  if constexpr (kRule == WeightUpdate::kNearest) {
    out = bf16_nearest4(fresh);
    dropped = fresh - out;
  } else if constexpr (kRule == WeightUpdate::kStochastic) {
    out = bf16_stochastic4(fresh, bits);
    dropped = fresh - out;
  } else {
    const F4 target = old + (u + load4(comp + i));  // the update plus what earlier roundings dropped
    out = bf16_nearest4(target);
    const F4 rest = target - out;  // exact: out is target's nearest neighbour
    const F4 kept = bf16_nearest4(rest);
    store4(comp + i, kept);
    dropped = rest - kept;
  }
  store4(w + i, out);
  const I4 moved_meant = u != 0;  // -1 where an update was meant
  l.intended -= moved_meant;
  l.lost -= moved_meant & (out == old);
  l.intended_sq += u * u;
  l.lost_sq += dropped * dropped;
}

// One rule's pass over [lo, hi), lo a multiple of Lanes::kWidth: the rule is a template
// argument so that the loop has no branch on it. Element i counts to lane i % 8, eight
// lanes wide: a float sum in one accumulator is a chain the compiler may not reorder,
// so a single sum would keep the pass scalar (it was 9x a plain rounding pass). Sums run
// in float within a lane of a chunk (at most 4096 terms), in double across lanes and
// chunks, in a fixed order: the counts do not depend on the thread count.
template <WeightUpdate kRule>
LostUpdates round_span(float* w, const float* before, float* comp, int64_t lo, int64_t hi, uint64_t base,
                       uint64_t seed, uint64_t stream) {
  constexpr int kW = Lanes::kWidth;
  static_assert(kW == 8, "two Lanes4 hold Lanes' eight lanes");
  const uint64_t key = kRule == WeightUpdate::kStochastic ? stream_key(seed, stream) : 0;
  Lanes4 low, high;  // lanes 0-3, 4-7
  int64_t i = lo;
  for (; i + kW <= hi; i += kW) {
    U4 bits_low = {}, bits_high = {};
    if constexpr (kRule == WeightUpdate::kStochastic) {
      // One 64-bit draw serves four elements (i is a multiple of 8): element i + j takes its quarter.
      const uint64_t h0 = draw(key, base + static_cast<uint64_t>(i)), h1 = draw(key, base + static_cast<uint64_t>(i + 4));
      bits_low = U4{static_cast<uint32_t>(h0), static_cast<uint32_t>(h0 >> 16), static_cast<uint32_t>(h0 >> 32),
                    static_cast<uint32_t>(h0 >> 48)};
      bits_high = U4{static_cast<uint32_t>(h1), static_cast<uint32_t>(h1 >> 16), static_cast<uint32_t>(h1 >> 32),
                     static_cast<uint32_t>(h1 >> 48)};
    }
    round_four<kRule>(w, before, comp, i, bits_low, low);
    round_four<kRule>(w, before, comp, i + 4, bits_high, high);
  }
  // The tail goes on in the same lanes, element by element.
  Lanes l;
  for (int j = 0; j < 4; ++j) {
    l.intended[j] = low.intended[j];
    l.intended[j + 4] = high.intended[j];
    l.lost[j] = low.lost[j];
    l.lost[j + 4] = high.lost[j];
    l.intended_sq[j] = low.intended_sq[j];
    l.intended_sq[j + 4] = high.intended_sq[j];
    l.lost_sq[j] = low.lost_sq[j];
    l.lost_sq[j + 4] = high.lost_sq[j];
  }
  for (; i < hi; ++i) {
    const auto index = base + static_cast<uint64_t>(i);
    const uint32_t bits = kRule == WeightUpdate::kStochastic ? quarter(draw(key, index), index) : 0;
    round_one<kRule>(w, before, comp, i, bits, l, static_cast<int>(i - lo) % kW);
  }
  LostUpdates s;
  s.elements = hi - lo;
  for (int j = 0; j < kW; ++j) {
    s.intended += l.intended[j];
    s.lost += l.lost[j];
    s.intended_sq += l.intended_sq[j];
    s.lost_sq += l.lost_sq[j];
  }
  return s;
}

LostUpdates round_span(float* w, const float* before, float* comp, int64_t lo, int64_t hi, uint64_t base,
                       WeightUpdate rule, uint64_t seed, uint64_t stream) {
  switch (rule) {
    case WeightUpdate::kNearest: return round_span<WeightUpdate::kNearest>(w, before, comp, lo, hi, base, seed, stream);
    case WeightUpdate::kStochastic:
      return round_span<WeightUpdate::kStochastic>(w, before, comp, lo, hi, base, seed, stream);
    case WeightUpdate::kKahan: break;
  }
  return round_span<WeightUpdate::kKahan>(w, before, comp, lo, hi, base, seed, stream);
}

LostUpdates round_cpu(float* w, const float* before, float* comp, int64_t n, WeightUpdate rule, uint64_t seed,
                      uint64_t stream) {
  // Fixed chunks summed in order: the counts and norms do not depend on the thread count.
  constexpr int64_t kChunk = kUpdateChunk;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<LostUpdates> parts(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      parts[static_cast<size_t>(c)] = round_span(w, before, comp, c * kChunk, std::min(n, (c + 1) * kChunk), 0, rule, seed,
                                                 stream);
  });
  LostUpdates total;
  for (const auto& p : parts) total += p;
  return total;
}

} // namespace

LostUpdates round_update_span(float* weight, const float* before, float* compensation, int64_t n, uint64_t first,
                              WeightUpdate rule, uint64_t seed, uint64_t stream) {
  TORCH_CHECK(first % 8 == 0, "round_update_span: the first element's index must be a multiple of 8, got ", first);
  TORCH_CHECK(rule != WeightUpdate::kKahan || compensation, "round_update_span: kahan needs a compensation");
  return round_span(weight, before, compensation, 0, n, first, rule, seed, stream);
}

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
