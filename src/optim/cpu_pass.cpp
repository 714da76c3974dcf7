// The core's CPU arithmetic: see cpu_pass.h for why the root is IEEE's.
//
// This file is compiled with -ffp-contract=off (CMakeLists.txt): a multiply and an add
// stay two roundings unless written as std::fma / _mm256_fmadd_ps, exactly where ATen's
// kernels fuse them (lerp; addcmul's `value * t1` times t2 plus self; add with an alpha).
// Contracted elsewhere, the bits would depend on the compiler.
#include "cpu_pass.h"

#include "mixtrain/compat.h"
#include "util/env_switch.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <array>
#include <cmath>
#include <limits>

namespace mixtrain::optim::detail {

// MIXTRAIN_CPU_AVX2=0 takes the element-by-element path on a CPU with AVX2 (tests: the two
// paths give the same bits). Read at each span: a test sets it within one process.
bool cpu_pass_vectorized() {
  return compat::cpu_has_avx2_fma() && !mixtrain::detail::env_equals("MIXTRAIN_CPU_AVX2", "0");
}

namespace {

// ---- one element: the tail of the vector loops, and the whole pass without AVX2 ----

// bf16 through c10::BFloat16: torch's own widening, and its rounding to nearest (even; NaN
// to its canonical 0x7fc0), which a state's copy_ takes and store8 does eight at a time.
inline float load1(const Operand& o, int64_t i) {
  if (!o.bf16) return static_cast<const float*>(o.data)[i];
  return static_cast<float>(static_cast<const c10::BFloat16*>(o.data)[i]);
}

inline void store1(const Operand& o, int64_t i, float x) {
  if (o.bf16)
    static_cast<c10::BFloat16*>(o.data)[i] = c10::BFloat16(x);
  else
    static_cast<float*>(o.data)[i] = x;
}

// ATen's maximum: NaN if either is.
inline float maximum1(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  return a < b ? b : a;
}

inline __attribute__((always_inline)) void adam_one(const AdamScalars& s, int64_t i, const Operand& param,
                                                     const Operand& grad, const Operand& exp_avg,
                                                     const Operand& exp_avg_sq, const Operand& max_sq,
                                                     float* new_weight, float* old_weight) {
  float p = load1(param, i), g = load1(grad, i);
  if (s.maximize) g = -g;
  const float old = p;
  if (s.decoupled_decay) p = p * s.decay_factor;              // p.mul_(1 - lr * wd)
  if (s.coupled_decay) g = std::fma(p, s.weight_decay, g);    // grad.add(p, alpha=wd)
  float m = load1(exp_avg, i);
  const float d = g - m;                                       // exp_avg.lerp_(grad, 1 - beta1)
  m = s.lerp_weight < 0.5f ? std::fma(s.lerp_weight, d, m) : std::fma(s.lerp_weight - 1.0f, d, g);
  float v = load1(exp_avg_sq, i) * s.beta2;                    // exp_avg_sq.mul_(beta2)
  v = std::fma(s.sq_coefficient * g, g, v);                    // .addcmul_(grad, grad, 1 - beta2)
  store1(exp_avg, i, m);
  store1(exp_avg_sq, i, v);
  float r = v;
  if (s.amsgrad) {
    r = maximum1(load1(max_sq, i), v);
    store1(max_sq, i, r);
  }
  const float denom = std::sqrt(r) / s.bias_correction2_sqrt + s.eps;
  p = p + (s.neg_step_size * m) / denom;                       // p.addcdiv_(exp_avg, denom, -step_size)
  if (new_weight) {
    new_weight[i] = p;
    old_weight[i] = old;
  } else {
    static_cast<float*>(param.data)[i] = p;
  }
}

// ---- eight elements: AVX2 + FMA, the same operations lane by lane ----

template <bool kBf16>
__attribute__((target("avx2,fma"))) inline __m256 load8(const void* data, int64_t i) {
  if constexpr (!kBf16) {
    return _mm256_loadu_ps(static_cast<const float*>(data) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(data) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <bool kBf16>
__attribute__((target("avx2,fma"))) inline void store8(void* data, int64_t i, __m256 x) {
  if constexpr (!kBf16) {
    _mm256_storeu_ps(static_cast<float*>(data) + i, x);
  } else {
    const __m256i b = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
    // Pack each 128-bit half's four 32-bit words to 16 bits, then bring the halves together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + i), _mm256_castsi256_si128(packed));
  }
}

// The storage dtypes (weight, gradient, the moments together), amsgrad and Adam's coupled
// decay are template arguments: the loop has no branch. Maximize and AdamW's decay are
// arithmetic that is exact when off (a sign flip by +0.0's bits, a product with 1.0f).
template <bool kParamBf16, bool kGradBf16, bool kStateBf16, bool kAmsgrad, bool kCoupledDecay>
__attribute__((target("avx2,fma"))) void adam_span_avx2(const AdamScalars& s, int64_t n, const Operand& param,
                                                        const Operand& grad, const Operand& exp_avg,
                                                        const Operand& exp_avg_sq, const Operand& max_sq,
                                                        float* new_weight, float* old_weight) {
  const __m256 decay_factor = _mm256_set1_ps(s.decoupled_decay ? s.decay_factor : 1.0f);
  const __m256 weight_decay = _mm256_set1_ps(s.weight_decay);
  const bool small = s.lerp_weight < 0.5f;
  const __m256 lerp_coeff = _mm256_set1_ps(small ? s.lerp_weight : s.lerp_weight - 1.0f);
  const __m256 beta2 = _mm256_set1_ps(s.beta2), sq_coefficient = _mm256_set1_ps(s.sq_coefficient);
  const __m256 bc2_sqrt = _mm256_set1_ps(s.bias_correction2_sqrt), eps = _mm256_set1_ps(s.eps);
  const __m256 neg_step_size = _mm256_set1_ps(s.neg_step_size);
  const __m256 sign = _mm256_set1_ps(s.maximize ? -0.0f : 0.0f);
  // lerp's base: the old moment for a small weight, the gradient otherwise (an all-ones mask picks g).
  const __m256 pick_grad = _mm256_castsi256_ps(_mm256_set1_epi32(small ? 0 : -1));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 p = load8<kParamBf16>(param.data, i);
    __m256 g = _mm256_xor_ps(load8<kGradBf16>(grad.data, i), sign);
    const __m256 old = p;
    p = _mm256_mul_ps(p, decay_factor);
    if constexpr (kCoupledDecay) g = _mm256_fmadd_ps(p, weight_decay, g);
    __m256 m = load8<kStateBf16>(exp_avg.data, i);
    const __m256 d = _mm256_sub_ps(g, m);
    m = _mm256_fmadd_ps(lerp_coeff, d, _mm256_blendv_ps(m, g, pick_grad));
    __m256 v = _mm256_mul_ps(load8<kStateBf16>(exp_avg_sq.data, i), beta2);
    v = _mm256_fmadd_ps(_mm256_mul_ps(sq_coefficient, g), g, v);
    store8<kStateBf16>(exp_avg.data, i, m);
    store8<kStateBf16>(exp_avg_sq.data, i, v);
    __m256 r = v;
    if constexpr (kAmsgrad) {
      const __m256 prev = load8<kStateBf16>(max_sq.data, i);
      const __m256 either_nan = _mm256_cmp_ps(prev, v, _CMP_UNORD_Q);
      r = _mm256_or_ps(_mm256_max_ps(prev, v), either_nan);
      store8<kStateBf16>(max_sq.data, i, r);
    }
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(r), bc2_sqrt), eps);
    p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step_size, m), denom));
    if constexpr (kParamBf16) {
      _mm256_storeu_ps(new_weight + i, p);
      _mm256_storeu_ps(old_weight + i, old);
    } else {
      _mm256_storeu_ps(static_cast<float*>(param.data) + i, p);
    }
  }
  for (; i < n; ++i) adam_one(s, i, param, grad, exp_avg, exp_avg_sq, max_sq, new_weight, old_weight);
}

using AdamSpanFn = void (*)(const AdamScalars&, int64_t, const Operand&, const Operand&, const Operand&,
                            const Operand&, const Operand&, float*, float*);

/// The instantiation for these flags, one flag per template argument in order.
template <bool... kFlags>
AdamSpanFn adam_span_avx2_for(const std::array<bool, 5>& flags) {
  if constexpr (sizeof...(kFlags) == 5) {
    return &adam_span_avx2<kFlags...>;
  } else {
    return flags[sizeof...(kFlags)] ? adam_span_avx2_for<kFlags..., true>(flags)
                                     : adam_span_avx2_for<kFlags..., false>(flags);
  }
}

__attribute__((target("avx2,fma"))) void sqrt_span_avx2(const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_sqrt_ps(_mm256_loadu_ps(in + i)));
  for (; i < n; ++i) out[i] = std::sqrt(in[i]);
}

void sqrt_span(const float* in, float* out, int64_t n) {
  if (cpu_pass_vectorized()) return sqrt_span_avx2(in, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = std::sqrt(in[i]);
}

} // namespace

torch::Tensor sqrt_correctly_rounded(const torch::Tensor& t) {
  if (!t.is_cpu() || t.scalar_type() != torch::kFloat) return t.sqrt();
  const torch::Tensor in = t.contiguous();
  torch::Tensor out = torch::empty_like(in);
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, in.numel(), int64_t{1} << 15, [&](int64_t lo, int64_t hi) { sqrt_span(src + lo, dst + lo, hi - lo); });
  return out;
}

AdamScalars adam_scalars(const UpdateRule& r, int64_t step) {
  AdamScalars s;
  const double stepd = static_cast<double>(step);
  s.maximize = r.maximize;
  s.amsgrad = r.amsgrad;
  s.decoupled_decay = r.kind == OptimizerKind::kAdamW && r.weight_decay != 0;
  s.coupled_decay = r.kind == OptimizerKind::kAdam && r.weight_decay != 0;
  // Each scalar as torch.optim computes it (double) and ATen narrows it at its op.
  s.decay_factor = static_cast<float>(1 - r.lr * r.weight_decay);
  s.weight_decay = static_cast<float>(r.weight_decay);
  s.lerp_weight = static_cast<float>(1 - r.beta1);
  s.beta2 = static_cast<float>(r.beta2);
  s.sq_coefficient = static_cast<float>(1 - r.beta2);
  const double bias_correction1 = 1 - std::pow(r.beta1, stepd);
  const double bias_correction2 = 1 - std::pow(r.beta2, stepd);
  s.bias_correction2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));  // Python's `** 0.5`
  s.eps = static_cast<float>(r.eps);
  s.neg_step_size = static_cast<float>(-(r.lr / bias_correction1));
  return s;
}

void adam_span(const AdamScalars& s, int64_t n, Operand param, Operand grad, Operand exp_avg, Operand exp_avg_sq,
               Operand max_sq, float* new_weight, float* old_weight) {
  TORCH_INTERNAL_ASSERT(exp_avg.bf16 == exp_avg_sq.bf16 && (!s.amsgrad || max_sq.bf16 == exp_avg.bf16),
                        "adam_span: the moments share one dtype");
  TORCH_INTERNAL_ASSERT(param.bf16 == (new_weight != nullptr), "adam_span: a bf16 weight is written to scratch");
  if (cpu_pass_vectorized())
    return adam_span_avx2_for<>({param.bf16, grad.bf16, exp_avg.bf16, s.amsgrad, s.coupled_decay})(
        s, n, param, grad, exp_avg, exp_avg_sq, max_sq, new_weight, old_weight);
  for (int64_t i = 0; i < n; ++i) adam_one(s, i, param, grad, exp_avg, exp_avg_sq, max_sq, new_weight, old_weight);
}

namespace {
__attribute__((target("avx2,fma"))) void store_bf16_avx2(const float* from, const Operand& out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8<true>(out.data, i, _mm256_loadu_ps(from + i));
  for (; i < n; ++i) store1(out, i, from[i]);
}
} // namespace

void store_bf16(const float* from, void* to, int64_t n) {
  const Operand out{to, true};
  if (cpu_pass_vectorized()) return store_bf16_avx2(from, out, n);
  for (int64_t i = 0; i < n; ++i) store1(out, i, from[i]);
}

void load_bf16(const void* from, float* to, int64_t n) {
  const Operand o{const_cast<void*>(from), true};
  for (int64_t i = 0; i < n; ++i) to[i] = load1(o, i);
}

} // namespace mixtrain::optim::detail
