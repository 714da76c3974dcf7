// fp16/bf16 emulation: the rounding kernels, the autograd-aware round trip,
// which tensors hold reduced-precision results, and the guard. The per-op rules
// live in dispatch_mode.cpp, where the dispatcher hands us each op.
#include "mixtrain/amp/reduced_precision_emulation.h"

#include "dispatch_mode.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/autograd.h>

#include <cstring>
#include <unordered_map>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define MIXTRAIN_HAVE_F16C_PATH 1
#endif

namespace mixtrain::amp {

namespace {

// ---- Rounding kernels: float -> half/bfloat16 -> float in one pass.

void round_half_scalar(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(c10::Half(in[i]));
}

#ifdef MIXTRAIN_HAVE_F16C_PATH
// F16C converts 8 floats at a time with IEEE round-to-nearest-even, overflow to
// inf and half subnormals, as c10::Half does. Compiled for F16C only here; used
// when the CPU reports it.
__attribute__((target("avx,f16c"))) void round_half_f16c(const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  round_half_scalar(in + i, out + i, n - i);
}

bool cpu_has_f16c() {
  // CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c");
  // "avx" also checks that the OS saves the YMM registers.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  }();
  return has;
}
#endif

/// bfloat16's round-to-nearest-even on the upper 16 bits, NaN kept quiet: what
/// c10::BFloat16's conversion does, written so the compiler vectorizes it.
void round_bf16(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, in + i, sizeof(u));
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t r = nan ? 0x7fc00000u : rounded;
    std::memcpy(out + i, &r, sizeof(r));
  }
}

void round_chunk(const float* in, float* out, int64_t n, c10::ScalarType dtype) {
  if (dtype == c10::ScalarType::BFloat16) return round_bf16(in, out, n);
#ifdef MIXTRAIN_HAVE_F16C_PATH
  if (cpu_has_f16c()) return round_half_f16c(in, out, n);
#endif
  round_half_scalar(in, out, n);
}

/// Identity that rounds through `dtype`, forward and backward.
struct RoundThrough : torch::autograd::Function<RoundThrough> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t dtype) {
    ctx->saved_data["dtype"] = dtype;
    return detail::rounded_copy(x, static_cast<c10::ScalarType>(dtype));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {detail::rounded_copy(grads[0], dtype), torch::Tensor()};
  }
};

// ---- Which tensors hold reduced-precision results (per thread, per emulation).

/// A weak reference keeps a TensorImpl's memory (not its data) alive, so an
/// address in the map cannot be reused by another tensor while it is there;
/// `expired()` says whether the tensor is gone.
thread_local std::unordered_map<const c10::TensorImpl*, c10::weak_intrusive_ptr<c10::TensorImpl>> marks;
thread_local size_t sweep_at = 4096;
thread_local c10::ScalarType emulated = c10::ScalarType::Undefined;
thread_local int guards = 0;

} // namespace

void round_floats(const float* in, float* out, int64_t n, c10::ScalarType dtype) {
  TORCH_CHECK(dtype == c10::ScalarType::Half || dtype == c10::ScalarType::BFloat16,
              "round_floats: dtype must be Half or BFloat16, got ", dtype);
  constexpr int64_t kGrain = 1 << 15;  // below ~128 KB one thread is faster than waking others
  if (n < 2 * kGrain) return round_chunk(in, out, n, dtype);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) { round_chunk(in + begin, out + begin, end - begin, dtype); });
}

namespace detail {

torch::Tensor rounded_copy(const torch::Tensor& x, c10::ScalarType dtype) {
  if (!x.defined() || x.scalar_type() != torch::kFloat || !x.device().is_cpu())
    return x.defined() && x.is_floating_point() ? x.to(dtype).to(x.scalar_type()) : x;
  c10::impl::ExcludeDispatchKeyGuard off(kModeKey);
  const torch::Tensor src = x.contiguous();
  torch::Tensor out = torch::empty_like(src, at::MemoryFormat::Contiguous);
  round_floats(src.data_ptr<float>(), out.data_ptr<float>(), src.numel(), dtype);
  return out;
}

void round_in_place(const torch::Tensor& t, c10::ScalarType dtype) {
  if (!t.defined() || t.scalar_type() != torch::kFloat || t.numel() == 0) return;
  if (t.device().is_cpu() && t.is_non_overlapping_and_dense()) {
    // Dense with positive strides: the elements fill [data_ptr, data_ptr + numel) in some order.
    float* p = t.data_ptr<float>();
    round_floats(p, p, t.numel(), dtype);
    return;
  }
  c10::impl::ExcludeDispatchKeyGuard off(kModeKey);
  // variable_data(): a write autograd does not count (no version bump), like the in-place pass above.
  t.variable_data().copy_(rounded_copy(t, dtype));
}

void mark_reduced(const torch::Tensor& t) {
  if (!t.defined()) return;
  if (marks.size() >= sweep_at) {
    for (auto it = marks.begin(); it != marks.end();) it = it->second.expired() ? marks.erase(it) : std::next(it);
    sweep_at = std::max<size_t>(4096, 2 * marks.size());
  }
  marks.emplace(t.unsafeGetTensorImpl(), c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()));
}

bool is_marked(const torch::Tensor& t) {
  if (!t.defined() || marks.empty()) return false;
  const auto it = marks.find(t.unsafeGetTensorImpl());
  return it != marks.end() && !it->second.expired();
}

c10::ScalarType emulated_dtype() { return emulated; }

} // namespace detail

torch::Tensor round_through(const torch::Tensor& x, c10::ScalarType dtype) {
  if (!x.defined() || x.scalar_type() != torch::kFloat) return x;
  c10::impl::ExcludeDispatchKeyGuard off(detail::kModeKey);
  if (!x.requires_grad() || !torch::GradMode::is_enabled()) return detail::rounded_copy(x, dtype);
  return RoundThrough::apply(x, static_cast<int64_t>(dtype));
}

torch::Tensor round_through_half(const torch::Tensor& x) { return round_through(x, c10::ScalarType::Half); }

bool holds_reduced_result(const torch::Tensor& t) { return detail::is_marked(t); }

struct ReducedPrecisionEmulation::Impl {
  explicit Impl(c10::ScalarType dtype) : previous(emulated) {
    TORCH_CHECK(dtype == c10::ScalarType::Half || dtype == c10::ScalarType::BFloat16,
                "ReducedPrecisionEmulation: dtype must be Half or BFloat16, got ", dtype);
    emulated = dtype;
    ++guards;
  }
  ~Impl() {
    emulated = previous;
    if (--guards == 0) marks.clear();  // the pass is over: its tensors are plain fp32 to later code
  }
  c10::ScalarType previous;
  detail::DispatchModeGuard on{detail::Mode::kReducedPrecisionEmulation};
};

ReducedPrecisionEmulation::ReducedPrecisionEmulation(c10::ScalarType dtype) : impl_(std::make_unique<Impl>(dtype)) {}
ReducedPrecisionEmulation::~ReducedPrecisionEmulation() = default;

bool ReducedPrecisionEmulation::is_enabled() { return detail::mode_active(detail::Mode::kReducedPrecisionEmulation); }
c10::ScalarType ReducedPrecisionEmulation::dtype() { return is_enabled() ? emulated : c10::ScalarType::Undefined; }

} // namespace mixtrain::amp
