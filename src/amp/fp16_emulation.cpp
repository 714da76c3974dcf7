#include "mixtrain/amp/fp16_emulation.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
#include <unordered_set>

namespace mixtrain::amp {

namespace {

constexpr c10::DispatchKey kEmulationKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

/// CUDA autocast's lower-precision (fp16) op list.
bool runs_in_fp16_under_autocast(const c10::OperatorHandle& op) {
  static const std::unordered_set<std::string> kOps = {
      "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::conv_tbc",
      "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::convolution",
      "aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::prelu", "aten::addmm", "aten::addmv",
      "aten::addr", "aten::matmul", "aten::einsum", "aten::mm", "aten::mv", "aten::linear", "aten::addbmm",
      "aten::baddbmm", "aten::bmm", "aten::chain_matmul", "aten::linalg_multi_dot", "aten::_thnn_fused_lstm_cell",
      "aten::_thnn_fused_gru_cell", "aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell",
      "aten::rnn_relu_cell", "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention"};
  return kOps.count(op.schema().name()) > 0;
}

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

c10::IValue round_value(const c10::IValue& v) {
  if (v.isTensor()) return round_through_half(v.toTensor());
  if (v.isTensorList()) {
    std::vector<torch::Tensor> out;
    for (const auto& t : v.toTensorVector()) out.push_back(round_through_half(t));
    return out;
  }
  return v;
}

void emulation_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kEmulationKey);
  if (!runs_in_fp16_under_autocast(op)) {
    op.redispatchBoxed(below, stack);  // the key stays on: inner listed ops still round
    return;
  }
  // Listed op: round inputs, run it with emulation off inside, round outputs.
  c10::impl::ExcludeDispatchKeyGuard off(kEmulationKey);
  const size_t n_args = op.schema().arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n_args); it != stack->end(); ++it) *it = round_value(*it);
  op.redispatchBoxed(below, stack);
  const size_t n_out = op.schema().returns().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n_out); it != stack->end(); ++it) *it = round_value(*it);
}

} // namespace

torch::Tensor round_through_half(const torch::Tensor& x) {
  if (!x.defined() || x.scalar_type() != torch::kFloat) return x;
  c10::impl::ExcludeDispatchKeyGuard off(kEmulationKey);
  return RoundThroughHalf::apply(x);
}

struct Fp16Emulation::Impl {
  c10::impl::IncludeDispatchKeyGuard on{kEmulationKey};
};

Fp16Emulation::Fp16Emulation() : impl_(std::make_unique<Impl>()) {}
Fp16Emulation::~Fp16Emulation() = default;

bool Fp16Emulation::is_enabled() { return c10::impl::tls_is_dispatch_key_included(kEmulationKey); }

} // namespace mixtrain::amp

TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&mixtrain::amp::emulation_fallback>());
}
