// BatchNorm2d's training forward on the CPU, torch's arithmetic with more of it in flight.
//
// What torch 2.13's contiguous fp32 kernel computes (aten/src/ATen/native/cpu/
// batch_norm_kernel.cpp and Normalization.cpp), and this file repeats exactly:
//   per channel c, over its N * HW values in memory order (batch outer, pixel inner):
//     sum      = a double sum, value by value;       mean = float(sum / count)
//     var_sum  = a double sum of float((x - mean)^2); kept as a float
//     invstd   = float(1 / sqrt(double(var_sum / float(count)) + eps))
//     running_mean = float(m * mean) + float((1 - m) * running_mean)                  (float)
//     running_var  = float(double(m) * float(var_sum / (count - 1)) + float((1 - m) * running_var))
//   with m the momentum as a float; then alpha = invstd * weight, beta = fma(-mean, alpha, bias)
//   and out = fma(x, alpha, beta) (ATen's kernel file is built with FMA on AVX2 and AVX-512
//   CPUs, and the compiler fuses both). The two sums are one dependent chain each: torch runs
//   one channel's chain at a time, each addition waiting for the last. Here a thread runs up to
//   eight channels' chains side by side, each chain in its own order.
//
// The file is built with -ffp-contract=off (CMakeLists.txt): a multiply and an add fuse only
// where std::fma or _mm256_fmadd_ps says so, as in torch's.
#include "mixtrain/models/batch_norm.h"

#include "mixtrain/compat.h"
#include "util/env_switch.h"

#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <vector>

namespace mixtrain::models {

namespace {

using torch::Tensor;

/// Channels whose chains one thread runs side by side: enough independent additions to
/// cover an addition's latency several times over; their rows stay in L1 while they run.
constexpr int64_t kChainsPerThread = 8;

/// Mean and variance sum of channels [c0, c0 + K) of a contiguous [N, C, HW] batch.
template <int64_t K>
void channel_statistics(const float* x, int64_t n_batch, int64_t channels, int64_t hw, int64_t c0, float* mean,
                        float* var_sum) {
  const int64_t count = n_batch * hw;
  std::array<double, K> sum{};
  for (int64_t n = 0; n < n_batch; ++n) {
    const float* rows = x + (n * channels + c0) * hw;
    for (int64_t i = 0; i < hw; ++i)
      for (int64_t k = 0; k < K; ++k) sum[k] += rows[k * hw + i];
  }
  std::array<float, K> m{};
  for (int64_t k = 0; k < K; ++k) m[k] = mean[c0 + k] = static_cast<float>(sum[k] / count);
  std::array<double, K> squares{};
  for (int64_t n = 0; n < n_batch; ++n) {
    const float* rows = x + (n * channels + c0) * hw;
    for (int64_t i = 0; i < hw; ++i)
      for (int64_t k = 0; k < K; ++k) {
        const float d = rows[k * hw + i] - m[k];
        squares[k] += d * d;  // the float square, added in double
      }
  }
  for (int64_t k = 0; k < K; ++k) var_sum[c0 + k] = static_cast<float>(squares[k]);
}

/// Columns j of the 8 x 8 block whose rows are r[0..7]: out[j] = (r[0][j], ..., r[7][j]).
__attribute__((target("avx2,fma"))) inline void transpose8(const __m256 (&r)[8], __m256 (&out)[8]) {
  __m256 t[8], s[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    s[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    out[j] = _mm256_permute2f128_ps(s[j], s[j + 4], 0x20);
    out[j + 4] = _mm256_permute2f128_ps(s[j], s[j + 4], 0x31);
  }
}

/// channel_statistics<8> with the eight chains in two vectors of four doubles: each block of
/// eight pixels of the eight rows is transposed, so that one vector addition advances four
/// channels' chains by one value each, in each chain's own order. `Square` picks the pass:
/// the values, or their float squared deviations from `m`.
template <bool Square>
__attribute__((target("avx2,fma"))) void eight_chains_avx2(const float* x, int64_t n_batch, int64_t channels,
                                                           int64_t hw, int64_t c0, const float* m, double* sums) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  const __m256 mean = Square ? _mm256_loadu_ps(m) : _mm256_setzero_ps();
  const int64_t whole = hw - hw % 8;
  alignas(32) double tail[8];
  for (int64_t n = 0; n < n_batch; ++n) {
    const float* rows = x + (n * channels + c0) * hw;
    for (int64_t i = 0; i < whole; i += 8) {
      __m256 r[8], col[8];
      for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(rows + k * hw + i);
      transpose8(r, col);
      for (int j = 0; j < 8; ++j) {
        __m256 v = col[j];
        if constexpr (Square) {
          const __m256 d = _mm256_sub_ps(v, mean);
          v = _mm256_mul_ps(d, d);
        }
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
      }
    }
    if (whole < hw) {  // the row's last pixels, one chain at a time, still in order
      _mm256_store_pd(tail, lo);
      _mm256_store_pd(tail + 4, hi);
      for (int k = 0; k < 8; ++k)
        for (int64_t i = whole; i < hw; ++i) {
          float v = rows[k * hw + i];
          if constexpr (Square) {
            const float d = v - m[k];
            v = d * d;
          }
          tail[k] += v;
        }
      lo = _mm256_load_pd(tail);
      hi = _mm256_load_pd(tail + 4);
    }
  }
  _mm256_storeu_pd(sums, lo);
  _mm256_storeu_pd(sums + 4, hi);
}

/// channel_statistics<8> on a CPU with AVX2.
static_assert(kChainsPerThread == 8, "eight_chains_avx2 runs a block of eight channels");
void eight_channel_statistics(const float* x, int64_t n_batch, int64_t channels, int64_t hw, int64_t c0, float* mean,
                              float* var_sum) {
  const int64_t count = n_batch * hw;
  double sums[8];
  eight_chains_avx2<false>(x, n_batch, channels, hw, c0, nullptr, sums);
  float m[8];
  for (int k = 0; k < 8; ++k) m[k] = mean[c0 + k] = static_cast<float>(sums[k] / count);
  eight_chains_avx2<true>(x, n_batch, channels, hw, c0, m, sums);
  for (int k = 0; k < 8; ++k) var_sum[c0 + k] = static_cast<float>(sums[k]);
}

template <int64_t... K>
void channel_statistics_of(int64_t k, std::integer_sequence<int64_t, K...>, const float* x, int64_t n_batch,
                           int64_t channels, int64_t hw, int64_t c0, float* mean, float* var_sum) {
  ((k == K + 1 ? channel_statistics<K + 1>(x, n_batch, channels, hw, c0, mean, var_sum) : void()), ...);
}

/// out = fma(x, alpha, beta) over one channel's row of `n` values.
__attribute__((target("avx2,fma"))) void scale_shift_row(const float* x, float* out, int64_t n, float alpha,
                                                          float beta) {
  const __m256 a = _mm256_set1_ps(alpha), b = _mm256_set1_ps(beta);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), a, b));
  for (; i < n; ++i) out[i] = std::fma(x[i], alpha, beta);
}

__attribute__((target("fma"))) float fused_multiply_add(float a, float b, float c) { return std::fma(a, b, c); }

struct Statistics {
  Tensor out, save_mean, save_invstd;
};

/// The training forward: the output, the statistics the backward reads, and the running
/// statistics updated in place (as torch's kernel updates them, version counters included).
/// `chains`: the most channels one thread runs at once (the probe fixes it, so that it runs the
/// eight-channel kernel and the one-channel one whatever the thread count).
Statistics training_forward(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, double momentum, double eps, int64_t chains = 0) {
  const int64_t n_batch = input.size(0), channels = input.size(1), hw = input.numel() / (n_batch * channels);
  const int64_t count = n_batch * hw;
  const float* x = input.const_data_ptr<float>();
  Tensor save_mean = at::empty({channels}, input.options());
  float* mean = save_mean.mutable_data_ptr<float>();
  std::vector<float> var_sum(static_cast<size_t>(channels));
  float* vs = var_sum.data();

  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t per_block =
      chains > 0 ? chains : std::clamp<int64_t>((channels + threads - 1) / threads, 1, kChainsPerThread);
  const int64_t blocks = (channels + per_block - 1) / per_block;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t c0 = b * per_block, k = std::min(per_block, channels - c0);
      if (k == kChainsPerThread) {
        eight_channel_statistics(x, n_batch, channels, hw, c0, mean, vs);
        continue;
      }
      channel_statistics_of(k, std::make_integer_sequence<int64_t, kChainsPerThread>{}, x, n_batch, channels, hw, c0,
                            mean, vs);
    }
  });

  Tensor save_invstd = at::empty({channels}, input.options());
  float* invstd = save_invstd.mutable_data_ptr<float>();
  float* rm = running_mean.mutable_data_ptr<float>();
  float* rv = running_var.mutable_data_ptr<float>();
  const float m = static_cast<float>(momentum);
  const float keep = 1 - m;
  std::vector<float> alpha(static_cast<size_t>(channels)), beta(static_cast<size_t>(channels));
  const float* w = weight.const_data_ptr<float>();
  const float* bs = bias.const_data_ptr<float>();
  for (int64_t c = 0; c < channels; ++c) {
    invstd[c] = static_cast<float>(1 / std::sqrt(static_cast<double>(vs[c] / static_cast<float>(count)) + eps));
    rm[c] = m * mean[c] + keep * rm[c];
    const double unbiased = vs[c] / static_cast<float>(count - 1);
    rv[c] = static_cast<float>(m * unbiased + keep * rv[c]);
    alpha[c] = invstd[c] * w[c];
    beta[c] = fused_multiply_add(-mean[c], alpha[c], bs[c]);
  }
  torch::autograd::impl::bump_version(running_mean);
  torch::autograd::impl::bump_version(running_var);

  Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  float* o = out.mutable_data_ptr<float>();
  at::parallel_for(0, n_batch * channels, std::max<int64_t>(1, 16384 / hw), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t c = row % channels;
      scale_shift_row(x + row * hw, o + row * hw, hw, alpha[c], beta[c]);
    }
  });
  return {out, save_mean, save_invstd};
}

/// The forward above with torch's backward kernel (what autograd runs after torch's own
/// forward: native_batch_norm_backward on the saved mean and inverse deviation).
struct TrainingBatchNorm : torch::autograd::Function<TrainingBatchNorm> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                        const Tensor& bias, Tensor running_mean, Tensor running_var, double momentum, double eps) {
    Statistics s = training_forward(input, weight, bias, running_mean, running_var, momentum, eps);
    ctx->save_for_backward({input, weight, s.save_mean, s.save_invstd});
    ctx->saved_data["eps"] = eps;
    return s.out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::autograd::tensor_list result(7);
    if (!grads[0].defined()) return result;
    const std::array<bool, 3> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)};
    std::tie(result[0], result[1], result[2]) =
        at::native_batch_norm_backward(grads[0], saved[0], saved[1], /*running_mean=*/{}, /*running_var=*/{}, saved[2],
                                       saved[3], /*train=*/true, ctx->saved_data["eps"].toDouble(), mask);
    return result;
  }
};

/// Whether this process's torch and CPU give the bits the fast path gives: both forwards once,
/// on a batch whose rows end off the vector width and whose channels make a block of eight and
/// one of one, compared bit for bit (values from a formula: the caller's random streams stay
/// untouched).
bool matches_torch_here() {
  if (!compat::cpu_has_avx2_fma()) return false;
  if (mixtrain::detail::env_equals("MIXTRAIN_TORCH_BATCH_NORM", "1")) return false;
  const torch::NoGradGuard no_grad;
  const int64_t n = 3, c = 9, h = 6, w = 7;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat);
  const Tensor i = torch::arange(n * c * h * w, opts);
  const Tensor x = (torch::sin(i * 0.37) * 2.5 + torch::cos(i * 1.3) * 0.25 + 0.3).view({n, c, h, w});
  const Tensor ch = torch::arange(c, opts);
  const Tensor weight = ch * 0.1 + 0.5, bias = ch * 0.2 - 0.3;
  Tensor rm = ch * 0.1, rv = ch * 0.2 + 1;
  Tensor rm_torch = rm.clone(), rv_torch = rv.clone();
  const auto [out, mean, invstd] = at::native_batch_norm(x, weight, bias, rm_torch, rv_torch, true, 0.1, 1e-5);
  const Statistics s = training_forward(x, weight, bias, rm, rv, 0.1, 1e-5, /*chains=*/kChainsPerThread);
  return torch::equal(out, s.out) && torch::equal(mean, s.save_mean) && torch::equal(invstd, s.save_invstd) &&
         torch::equal(rm, rm_torch) && torch::equal(rv, rv_torch);
}

bool fast_path_available() {
  static const bool available = matches_torch_here();
  return available;
}

bool is_cpu_float(const Tensor& t) { return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat; }

} // namespace

bool batch_norm_fast_path_applies(const torch::nn::BatchNorm2dImpl& bn, const Tensor& input) {
  if (!bn.is_training() || !bn.options.affine() || !bn.options.track_running_stats()) return false;
  if (!is_cpu_float(input) || input.layout() != torch::kStrided || input.dim() != 4) return false;
  if (!is_cpu_float(bn.weight) || !is_cpu_float(bn.bias) || !is_cpu_float(bn.running_mean) ||
      !is_cpu_float(bn.running_var))
    return false;
  const int64_t channels = input.size(1), hw = input.size(2) * input.size(3);
  // torch's contiguous kernel, not its channels-last one (one channel or one pixel is both).
  if (channels < 2 || hw < 2 || input.size(0) < 1 || channels != bn.options.num_features()) return false;
  if (!input.is_contiguous() || input.is_contiguous(at::MemoryFormat::ChannelsLast)) return false;
  if (!bn.running_mean.is_contiguous() || !bn.running_var.is_contiguous()) return false;
  // No autocast and no dispatcher mode (mixtrain's emulation, fp32 norms, islands and tracer,
  // Python's modes): they see torch's op.
  if (!(c10::impl::tls_local_dispatch_key_set().included_ - c10::default_included_set).empty()) return false;
  if (compat::is_autocast_enabled(c10::DeviceType::CPU)) return false;
  return fast_path_available();
}

Tensor BatchNorm2dImpl::forward(const Tensor& input) {
  if (!batch_norm_fast_path_applies(*this, input)) return torch::nn::BatchNorm2dImpl::forward(input);
  // torch's module: count the batch, and the momentum (a cumulative average without one).
  double momentum = options.momentum().value_or(0.0);
  if (num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    if (!options.momentum().has_value()) momentum = 1.0 / num_batches_tracked.item<double>();
  }
  return TrainingBatchNorm::apply(input, weight, bias, running_mean, running_var, momentum, options.eps());
}

} // namespace mixtrain::models
