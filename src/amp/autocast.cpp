#include "mixtrain/amp/autocast.h"

#include "mixtrain/compat.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <mutex>

namespace mixtrain::amp {

namespace {

// ---- CPU autocast rules for the fused attention kernels ----
//
// nn.MultiheadAttention and nn.TransformerEncoderLayer take a fused fast path in
// eval / no_grad (aten::_native_multi_head_attention, aten::_transformer_encoder_layer_fwd).
// They leave it only when torch.is_autocast_enabled() says so, and that reads CUDA's
// flag alone, so under CPU autocast the fused kernel meets a bf16 activation and fp32
// weights and fails ("expected scalar type BFloat16 but found Float"): validation of
// torchvision's ViT under torch.autocast("cpu") failed that way (pytorch#106751,
// pytorch#132613). torch 2.1 gave _native_multi_head_attention a CPU autocast rule that
// runs it in the lower precision; torch 2.13 still has none for
// _transformer_encoder_layer_fwd. This adds that rule for each of these kernels that
// this libtorch has no AutocastCPU kernel for (so never twice), wherever it is missing.

/// The lower-precision policy, boxed (so one kernel serves any schema): every
/// floating-point CPU tensor argument except doubles is cast to the CPU autocast
/// dtype, then the op runs below autocast.
void run_in_cpu_autocast_dtype(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::ScalarType dtype = compat::get_autocast_dtype(c10::DeviceType::CPU);
  const size_t n_args = op.schema().arguments().size();
  for (size_t i = stack->size() - n_args; i < stack->size(); ++i) {
    c10::IValue& arg = (*stack)[i];
    if (!arg.isTensor()) continue;
    const at::Tensor& t = arg.toTensor();
    if (t.defined() && t.is_floating_point() && t.device().is_cpu() && t.scalar_type() != c10::ScalarType::Double &&
        t.scalar_type() != dtype)
      arg = t.to(dtype);
  }
  c10::impl::ExcludeDispatchKeyGuard below_autocast(c10::DispatchKey::AutocastCPU);
  op.callBoxed(stack);
}

void add_missing_cpu_autocast_rules() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept for the process: the dispatcher holds the registrations while the Library lives.
    static auto* rules = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
    for (const char* name : {"_native_multi_head_attention", "_transformer_encoder_layer_fwd"}) {
      const auto op = c10::Dispatcher::singleton().findSchema({std::string("aten::") + name, ""});
      if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::AutocastCPU)) continue;
      rules->impl(name, torch::CppFunction::makeFromBoxedFunction<&run_in_cpu_autocast_dtype>());
    }
  });
}

} // namespace

autocast::autocast(c10::DeviceType device, c10::ScalarType dtype, bool enabled, bool cache_enabled)
    : device_(device), prev_enabled_(compat::is_autocast_enabled(device)),
      prev_dtype_(compat::get_autocast_dtype(device)), prev_cache_enabled_(compat::is_autocast_cache_enabled()) {
  if (enabled && device == c10::DeviceType::CPU) add_missing_cpu_autocast_rules();
  compat::set_autocast_enabled(device, enabled);
  compat::set_autocast_dtype(device, dtype);
  compat::set_autocast_cache_enabled(cache_enabled);
  compat::increment_nesting();
}

autocast::~autocast() {
  if (compat::decrement_nesting() == 0) compat::clear_autocast_cache();
  compat::set_autocast_enabled(device_, prev_enabled_);
  compat::set_autocast_dtype(device_, prev_dtype_);
  compat::set_autocast_cache_enabled(prev_cache_enabled_);
}


} // namespace mixtrain::amp
