#include "dispatch_mode.h"

#include "mixtrain/amp/fp16_emulation.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>
#include <unordered_set>

namespace mixtrain::amp::detail {

namespace {

thread_local int emulation_depth = 0;
thread_local int norms_depth = 0;

int& depth(Mode mode) { return mode == Mode::kFp16Emulation ? emulation_depth : norms_depth; }

/// CUDA autocast's lower-precision (fp16) op list.
bool runs_in_fp16_under_autocast(const std::string& name) {
  static const std::unordered_set<std::string> kOps = {
      "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::conv_tbc",
      "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::convolution",
      "aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::prelu", "aten::addmm", "aten::addmv",
      "aten::addr", "aten::matmul", "aten::einsum", "aten::mm", "aten::mv", "aten::linear", "aten::addbmm",
      "aten::baddbmm", "aten::bmm", "aten::chain_matmul", "aten::linalg_multi_dot", "aten::_thnn_fused_lstm_cell",
      "aten::_thnn_fused_gru_cell", "aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell",
      "aten::rnn_relu_cell", "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention"};
  return kOps.count(name) > 0;
}

bool is_norm(const std::string& name) {
  return name == "aten::batch_norm" || name == "aten::layer_norm" || name == "aten::group_norm" ||
         name == "aten::instance_norm";
}

bool is_reduced(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() &&
         (v.toTensor().scalar_type() == at::kHalf || v.toTensor().scalar_type() == at::kBFloat16);
}

c10::IValue round_value(const c10::IValue& v) {
  if (v.isTensor()) return round_through_half(v.toTensor());
  if (v.isTensorList()) {
    std::vector<torch::Tensor> out;
    for (const auto& t : v.toTensorVector()) out.push_back(round_through_half(t));
    return out;
  }
  return v;
}

void mode_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kModeKey);
  const std::string& name = op.schema().name();
  const auto n_args = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  const auto n_out = static_cast<std::ptrdiff_t>(op.schema().returns().size());

  if (emulation_depth > 0 && runs_in_fp16_under_autocast(name)) {
    // Round inputs, run with the mode off inside (inner ops are not rounded again), round outputs.
    c10::impl::ExcludeDispatchKeyGuard off(kModeKey);
    for (auto it = stack->end() - n_args; it != stack->end(); ++it) *it = round_value(*it);
    op.redispatchBoxed(below, stack);
    for (auto it = stack->end() - n_out; it != stack->end(); ++it) *it = round_value(*it);
    return;
  }
  if (norms_depth > 0 && is_norm(name) && n_args > 0 && is_reduced(*(stack->end() - n_args))) {
    // A norm layer kept in fp32 receiving a half/bf16 input: normalize in fp32
    // (libtorch's CPU layer/group norm reject mixed dtypes), return the input's dtype.
    c10::impl::ExcludeDispatchKeyGuard off(kModeKey);
    auto& input = *(stack->end() - n_args);
    const auto dtype = input.toTensor().scalar_type();
    input = input.toTensor().to(at::kFloat);
    op.redispatchBoxed(below, stack);
    auto& out = *(stack->end() - n_out);
    if (out.isTensor()) out = out.toTensor().to(dtype);
    return;
  }
  op.redispatchBoxed(below, stack);  // the mode stays on for the op's inner calls
}

} // namespace

DispatchModeGuard::DispatchModeGuard(Mode mode) : mode_(mode), include_(kModeKey) { ++depth(mode); }
DispatchModeGuard::~DispatchModeGuard() { --depth(mode_); }

bool mode_active(Mode mode) { return depth(mode) > 0 && c10::impl::tls_is_dispatch_key_included(kModeKey); }

} // namespace mixtrain::amp::detail

TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&mixtrain::amp::detail::mode_fallback>());
}
