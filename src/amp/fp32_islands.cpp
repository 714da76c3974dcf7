// fp32 islands (mixtrain/amp/fp32_islands.h): which parameters an island owns, the
// guard that installs the islands on the dispatcher mode (dispatch_mode.cpp runs them),
// the names' check, and keep_fp32 for a hand-written loop.
#include "mixtrain/amp/fp32_islands.h"

#include "dispatch_mode.h"

#include "mixtrain/models/module_scope.h"
#include "mixtrain/util/option_error.h"

#include "util/comma_list.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace mixtrain::amp {

IslandParams island_params(const std::vector<std::string>& patterns, const torch::nn::Module& model) {
  IslandParams params;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    for (const auto& pattern : patterns)
      if (module_path_matches(pattern, item.key()))
        for (const auto& p : item.value()->parameters(/*recurse=*/true)) params.insert(p.unsafeGetTensorImpl());
  return params;
}

Fp32Islands::Fp32Islands(std::vector<std::string> patterns, std::shared_ptr<const IslandParams> params)
    : patterns_(std::move(patterns)), params_(std::move(params)) {
  previous_ = detail::set_islands(&patterns_);
  previous_params_ = detail::set_island_params(params_.get());
  mode_ = std::make_shared<detail::DispatchModeGuard>(detail::Mode::kFp32Islands);
}

Fp32Islands::~Fp32Islands() {
  mode_.reset();
  detail::set_islands(previous_);
  detail::set_island_params(previous_params_);
  if (held_) detail::set_islands_cast_back(previous_cast_back_);
  held_.reset();
}

std::vector<std::string> check_islands(const std::vector<std::string>& patterns, const std::vector<std::string>& paths) {
  std::vector<std::string> kept;
  for (const auto& pattern : patterns) {
    if (pattern.empty()) throw OptionError("keep_fp32", "an empty module name in " + Phrase::name("keep_fp32"));
    std::vector<std::string> matched;
    for (const auto& p : paths)
      if (module_path_matches(pattern, p)) matched.push_back(p);
    if (matched.empty()) {
      std::string close;
      for (const auto& c : closest_paths(pattern, paths)) close += (close.empty() ? "" : ", ") + c;
      throw OptionError("keep_fp32", Phrase::setting("keep_fp32", pattern) + " matches no module of the model" +
                                         (close.empty() ? std::string() : " (closest: " + close + ")"));
    }
    if (matched.size() == paths.size() && paths.size() > 1)
      throw OptionError("keep_fp32", Phrase::setting("keep_fp32", pattern) +
                                         " matches every module of the model: that is fp32 training, not an island");
    kept.insert(kept.end(), matched.begin(), matched.end());
  }
  return kept;
}

std::vector<std::string> check_islands(const std::vector<std::string>& patterns, const torch::nn::Module& model) {
  std::vector<std::string> paths;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) paths.push_back(item.key());
  std::vector<std::string> kept = check_islands(patterns, paths);
  // Islands that together hold every parameter are fp32 training too, as '*' is.
  const auto params = model.parameters(/*recurse=*/true);
  const IslandParams in_islands = island_params(patterns, model);
  const bool all = !params.empty() && std::all_of(params.begin(), params.end(), [&](const at::Tensor& p) {
    return in_islands.count(p.unsafeGetTensorImpl()) > 0;
  });
  if (all && paths.size() > 1)
    throw OptionError("keep_fp32", Phrase::setting("keep_fp32", mixtrain::detail::comma_joined(patterns)) +
                                       " keeps every parameter of the model in fp32: that is fp32 training, not an island");
  return kept;
}

namespace {

bool is_16_bit(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
}

/// A tensor of the model (a parameter or a buffer) held in fp32 by keep_fp32, and its dtype.
struct HeldTensor {
  at::Tensor tensor;
  at::ScalarType dtype;
};

/// Moves `t` (and its gradient) to `dtype` in place: set_data keeps the tensor object, so
/// the model, an optimizer and the islands' ownership set all still name it.
void retype(at::Tensor t, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  t.set_data(t.data().to(dtype));
  if (t.grad().defined()) t.mutable_grad() = t.grad().to(dtype);
}

} // namespace

std::unique_ptr<Fp32Islands> keep_fp32(const torch::nn::Module& model, const std::vector<std::string>& patterns) {
  check_islands(patterns, model);
  auto owned = std::make_shared<IslandParams>(island_params(patterns, model));
  // The islands' buffers count as theirs too: a BatchNorm without affine parameters is fed only them.
  std::vector<HeldTensor> held;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    for (const auto& pattern : patterns)
      if (module_path_matches(pattern, item.key())) {
        for (const auto& b : item.value()->buffers(/*recurse=*/true))
          if (b.defined()) owned->insert(b.unsafeGetTensorImpl());
        break;
      }
  // A model stored in bf16/fp16 (any parameter outside the islands is): its islands' 16-bit
  // tensors become fp32, and island ops hand back the dtype they were fed.
  bool stored_16_bit = false;
  for (const auto& p : model.parameters(/*recurse=*/true))
    stored_16_bit = stored_16_bit || (is_16_bit(p) && owned->count(p.unsafeGetTensorImpl()) == 0);
  auto islands = std::make_unique<Fp32Islands>(patterns, std::move(owned));
  if (!stored_16_bit) return islands;
  std::unordered_set<const void*> seen;  // a tied parameter once
  auto hold = [&](const at::Tensor& t) {
    if (!is_16_bit(t) || !islands->params_->count(t.unsafeGetTensorImpl()) || !seen.insert(t.unsafeGetTensorImpl()).second)
      return;
    held.push_back({t, t.scalar_type()});
    retype(t, at::kFloat);
  };
  for (const auto& p : model.parameters(/*recurse=*/true)) hold(p);
  for (const auto& b : model.buffers(/*recurse=*/true)) hold(b);
  islands->held_ = std::shared_ptr<void>(new std::vector<HeldTensor>(std::move(held)), [](void* p) {
    auto* tensors = static_cast<std::vector<HeldTensor>*>(p);
    for (auto& h : *tensors) retype(h.tensor, h.dtype);
    delete tensors;
  });
  islands->previous_cast_back_ = detail::set_islands_cast_back(true);
  return islands;
}

} // namespace mixtrain::amp
