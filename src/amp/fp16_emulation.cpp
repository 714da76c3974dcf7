#include "mixtrain/amp/fp16_emulation.h"

#include "dispatch_mode.h"

#include <torch/autograd.h>

namespace mixtrain::amp {

namespace {

/// Identity that rounds through half, forward and backward.
struct RoundThroughHalf : torch::autograd::Function<RoundThroughHalf> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) {
    return x.to(torch::kHalf).to(x.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor& g = grads[0];
    return {g.defined() ? g.to(torch::kHalf).to(g.scalar_type()) : g};
  }
};

} // namespace

torch::Tensor round_through_half(const torch::Tensor& x) {
  if (!x.defined() || x.scalar_type() != torch::kFloat) return x;
  c10::impl::ExcludeDispatchKeyGuard off(detail::kModeKey);
  return RoundThroughHalf::apply(x);
}

struct Fp16Emulation::Impl {
  detail::DispatchModeGuard on{detail::Mode::kFp16Emulation};
};

Fp16Emulation::Fp16Emulation() : impl_(std::make_unique<Impl>()) {}
Fp16Emulation::~Fp16Emulation() = default;

bool Fp16Emulation::is_enabled() { return detail::mode_active(detail::Mode::kFp16Emulation); }

} // namespace mixtrain::amp
