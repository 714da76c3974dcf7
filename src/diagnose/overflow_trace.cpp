// The overflow tracer: an amp::OpObserver (the dispatcher mode that fp16 emulation
// uses), so it sees every top-level op of a forward pass with real magnitudes.
#include "mixtrain/diagnose/overflow_trace.h"

#include "diagnostic_pass.h"
#include "mixtrain/amp/autocast.h"
#include "mixtrain/amp/fp32_islands.h"
#include "mixtrain/amp/reduced_precision_emulation.h"
#include "mixtrain/amp/op_trace.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/models/module_scope.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>

namespace mixtrain::diagnose {

std::string OpFinding::where() const {
  if (!module.empty()) return module + " (" + op + ")";
  if (!scope.empty()) return op + " in " + scope;
  if (!after_module.empty()) return op + " after " + after_module;
  return op;
}

namespace {

/// Ops that only move or reinterpret data: they carry a parameter's identity
/// (autocast's cast of a weight) and an activation's dtype without computing.
struct OutputStats {
  double max_abs = 0;
  int64_t nonfinite = 0;
  bool any_float = false;
};

OutputStats stats_of(c10::ArrayRef<c10::IValue> values) {
  OutputStats s;
  amp::for_each_tensor(values, [&](const torch::Tensor& t) {
    if (!t.is_floating_point() || t.numel() == 0) return;
    s.any_float = true;
    const torch::Tensor f = t.detach().to(torch::kFloat);
    const torch::Tensor finite = torch::isfinite(f);
    s.nonfinite += f.numel() - finite.sum().item<int64_t>();
    s.max_abs = std::max(s.max_abs, torch::where(finite, f.abs(), torch::zeros({}, f.options())).max().item<double>());
  });
  return s;
}

class Tracer : public amp::OpObserver {
 public:
  explicit Tracer(torch::nn::Module& model) {
    for (const auto& kv : model.named_parameters(/*recurse=*/true)) {
      const std::string& name = kv.key();
      const auto dot = name.rfind('.');
      owner_[kv.value().unsafeGetTensorImpl()] = dot == std::string::npos ? "" : name.substr(0, dot);
      keep_.push_back(kv.value());
    }
  }

  void on_op(const std::string& name, c10::ArrayRef<c10::IValue> inputs, c10::ArrayRef<c10::IValue> outputs,
             c10::ArrayRef<c10::IValue> results, bool fp16) override {
    // Which module, and whether the activations coming in are finite.
    std::string module;
    bool inputs_finite = true;
    amp::for_each_tensor(inputs, [&](const torch::Tensor& t) {
      auto it = owner_.find(t.unsafeGetTensorImpl());
      if (it != owner_.end()) {
        if (module.empty()) module = it->second;
        return;
      }
      if (t.is_floating_point() && inputs_finite && !torch::isfinite(t.detach()).all().item<bool>()) inputs_finite = false;
    });
    // A non-finite scalar argument (masked_fill(mask, -inf) in causal attention) makes
    // non-finite outputs on purpose: that is not an overflow.
    for (const auto& v : inputs)
      if (v.isDouble() && !std::isfinite(v.toDouble())) inputs_finite = false;

    if (amp::is_cast_or_view(name) && !module.empty()) {
      // autocast's fp16 copy of a weight (or a view of one) still belongs to its module.
      amp::for_each_tensor(results, [&](const torch::Tensor& t) { remember_owner(t, module); });
      return;
    }
    const OutputStats s = stats_of(outputs);
    if (!s.any_float) return;
    OpFinding f;
    f.index = trace_.ops_traced++;
    f.op = name;
    f.module = module;
    f.after_module = module.empty() ? last_module_ : "";
    f.scope = current_module_path();
    f.max_abs = s.max_abs;
    f.nonfinite = s.nonfinite;
    f.fp16 = fp16;
    if (!module.empty()) last_module_ = module;

    const bool made_nonfinite = s.nonfinite > 0 && inputs_finite;
    if (fp16 && (s.max_abs > kFp16Max || made_nonfinite)) {
      if (!trace_.first_overflow) trace_.first_overflow = f;
    } else if (fp16 && s.max_abs > kAtRiskMagnitude) {
      trace_.at_risk.push_back(f);
    } else if (!fp16 && made_nonfinite && !trace_.first_fp32_nonfinite) {
      trace_.first_fp32_nonfinite = f;
    }
  }

  OverflowTrace result() {
    std::sort(trace_.at_risk.begin(), trace_.at_risk.end(),
              [](const OpFinding& a, const OpFinding& b) { return a.max_abs > b.max_abs; });
    return trace_;
  }

 private:
  /// `t` (a cast or view of a parameter) belongs to `module` too.
  void remember_owner(const torch::Tensor& t, const std::string& module) {
    owner_[t.unsafeGetTensorImpl()] = module;
    keep_.push_back(t);
  }

  std::unordered_map<const c10::TensorImpl*, std::string> owner_;
  std::vector<torch::Tensor> keep_;
  std::string last_module_;
  OverflowTrace trace_;
};


} // namespace

OverflowTrace trace_overflow(Learner& learn, const data::Batch& batch) {
  torch::nn::Module& module = learn.model().module();
  const torch::Device device = learn.device();
  const data::Batch b = batch.to(device);

  const detail::DiagnosticPass pass(module);
  Tracer tracer(module);
  OverflowTrace trace;
  {
    torch::NoGradGuard no_grad;
    std::optional<amp::ReducedPrecisionEmulation> emulation;
    std::optional<amp::autocast> autocast;
    if (device.is_cuda())
      autocast.emplace(c10::DeviceType::CUDA, torch::kHalf);
    else
      emulation.emplace();
    // The learner's fp32 islands apply to the traced pass as they do to training.
    std::optional<amp::Fp32Islands> islands;
    if (const auto pc = learn.precision_cb(); pc && !pc->keep_fp32().empty())
      islands.emplace(pc->keep_fp32(), std::make_shared<const amp::IslandParams>(amp::island_params(pc->keep_fp32(), module)));
    amp::OpTraceScope observe(&tracer);
    torch::Tensor pred = learn.model().forward(learn.model().inputs_for(b));
    autocast.reset();
    emulation.reset();
    if (pred.is_floating_point()) pred = pred.to(torch::kFloat);  // the loss runs in fp32, as in training
    torch::Tensor loss = learn.loss_fn()(pred, b.y);
    trace = tracer.result();
    trace.loss = loss.item<double>();
  }
  for (const auto& x : b.inputs())
    if (x.is_floating_point() && !torch::isfinite(x).all().item<bool>()) trace.input_nonfinite = true;
  return trace;
}

} // namespace mixtrain::diagnose
