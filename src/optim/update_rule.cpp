#include "mixtrain/optim/update_rule.h"

#include "cpu_pass.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace mixtrain::optim {

bool cpu_pass_vectorized() { return detail::cpu_pass_vectorized(); }

std::vector<std::string> state_names(const UpdateRule& rule) {
  switch (rule.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
      if (rule.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
      return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::kSgd:
      if (rule.momentum != 0) return {"momentum_buffer"};
      return {};
    case OptimizerKind::kRmsprop: {
      std::vector<std::string> names = {"square_avg"};
      if (rule.momentum > 0) names.push_back("momentum_buffer");
      if (rule.centered) names.push_back("grad_avg");
      return names;
    }
    case OptimizerKind::kAdagrad: return {"sum"};
  }
  return {};
}

namespace {

using torch::Tensor;

// The step on fp32 tensors, torch.optim's single-tensor code op for op (torch 2.13's
// _single_tensor_adam, _sgd, _rmsprop, _adagrad without capturable/differentiable): the
// same ATen ops with the same double scalars, so that fp32 storage gives torch's bits.
// `p` and `state` are updated in place; `g` is read only.
void fp32_step(const UpdateRule& r, int64_t step, bool fresh_momentum, Tensor& p, Tensor g, std::vector<Tensor>& state) {
  if (r.maximize) g = g.neg();
  const double stepd = static_cast<double>(step);  // torch reads its float step tensor as a Python float
  switch (r.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam: {
      Tensor& exp_avg = state[0];
      Tensor& exp_avg_sq = state[1];
      if (r.weight_decay != 0) {
        if (r.kind == OptimizerKind::kAdamW)
          p.mul_(1 - r.lr * r.weight_decay);
        else
          g = g.add(p, r.weight_decay);
      }
      exp_avg.lerp_(g, 1 - r.beta1);
      exp_avg_sq.mul_(r.beta2).addcmul_(g, g, 1 - r.beta2);
      const double bias_correction1 = 1 - std::pow(r.beta1, stepd);
      const double bias_correction2 = 1 - std::pow(r.beta2, stepd);
      const double step_size = r.lr / bias_correction1;
      const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);  // Python's `** 0.5`, not sqrt
      Tensor denom;
      if (r.amsgrad) {
        Tensor& max_sq = state[2];
        at::maximum_out(max_sq, max_sq, exp_avg_sq);
        denom = (detail::sqrt_correctly_rounded(max_sq) / bias_correction2_sqrt).add_(r.eps);
      } else {
        denom = (detail::sqrt_correctly_rounded(exp_avg_sq) / bias_correction2_sqrt).add_(r.eps);
      }
      p.addcdiv_(exp_avg, denom, -step_size);
      return;
    }
    case OptimizerKind::kSgd: {
      if (r.weight_decay != 0) g = g.add(p, r.weight_decay);
      if (r.momentum != 0) {
        Tensor& buf = state[0];
        if (fresh_momentum)
          buf.copy_(g);  // torch: buf = grad.clone()
        else
          buf.mul_(r.momentum).add_(g, 1 - r.dampening);
        g = r.nesterov ? g.add(buf, r.momentum) : buf;
      }
      p.add_(g, -r.lr);
      return;
    }
    case OptimizerKind::kRmsprop: {
      if (r.weight_decay != 0) g = g.add(p, r.weight_decay);
      Tensor& square_avg = state[0];
      square_avg.mul_(r.alpha).addcmul_(g, g, 1 - r.alpha);
      Tensor avg;
      if (r.centered) {
        Tensor& grad_avg = state[r.momentum > 0 ? 2 : 1];
        grad_avg.lerp_(g, 1 - r.alpha);
        avg = detail::sqrt_correctly_rounded(square_avg.addcmul(grad_avg, grad_avg, -1));
      } else {
        avg = detail::sqrt_correctly_rounded(square_avg);
      }
      avg.add_(r.eps);
      if (r.momentum > 0) {
        Tensor& buf = state[1];
        buf.mul_(r.momentum).addcdiv_(g, avg);
        p.add_(buf, -r.lr);
      } else {
        p.addcdiv_(g, avg, -r.lr);
      }
      return;
    }
    case OptimizerKind::kAdagrad: {
      if (r.weight_decay != 0) g = g.add(p, r.weight_decay);
      const double clr = r.lr / (1 + (stepd - 1) * r.lr_decay);
      Tensor& sum = state[0];
      sum.addcmul_(g, g, 1);
      Tensor std = detail::sqrt_correctly_rounded(sum).add_(r.eps);
      p.addcdiv_(g, std, -clr);
      return;
    }
  }
}

bool is_fp32(const Tensor& t) { return t.scalar_type() == torch::kFloat; }

void check(const UpdateRule& rule, const ParamStep& s, amp::WeightUpdate weight_update) {
  TORCH_CHECK(s.param.defined() && s.param.is_floating_point(), "update_parameter: the parameter must be a floating-point tensor");
  TORCH_CHECK(s.grad.defined() && s.grad.is_floating_point() && s.grad.sizes() == s.param.sizes() &&
                  s.grad.device() == s.param.device(),
              "update_parameter: the gradient must be a floating-point tensor of the parameter's shape ", s.param.sizes(),
              " on its device");
  TORCH_CHECK(!s.grad.is_sparse(), "update_parameter: mixtrain's optimizers take dense gradients");
  const auto names = state_names(rule);
  TORCH_CHECK(s.state.size() == names.size(), "update_parameter: ", optimizer_name(rule.kind), " with these options keeps ",
              names.size(), " state tensors per parameter, got ", s.state.size());
  for (size_t i = 0; i < names.size(); ++i)
    TORCH_CHECK(s.state[i].defined() && s.state[i].is_floating_point() && s.state[i].sizes() == s.param.sizes() &&
                    s.state[i].device() == s.param.device(),
                "update_parameter: state '", names[i], "' must be a floating-point tensor of the parameter's shape ",
                s.param.sizes(), " on its device");
  TORCH_CHECK(s.step >= 1, "update_parameter: the step count starts at 1, got ", s.step);
  const auto dtype = s.param.scalar_type();
  TORCH_CHECK(dtype != torch::kHalf || weight_update == amp::WeightUpdate::kNearest, "update_parameter: weight_update=",
              amp::weight_update_name(weight_update),
              " rounds bf16 weights; fp16 parameters take 'nearest' only (for fp16, train fp32 parameters under "
              "autocast with a GradScaler)");
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf,
              "update_parameter: parameters are fp32, bf16 or fp16, got ", dtype);
  if (dtype == torch::kBFloat16 && weight_update == amp::WeightUpdate::kKahan)
    TORCH_CHECK(s.compensation.defined() && s.compensation.sizes() == s.param.sizes() &&
                    (s.compensation.scalar_type() == torch::kBFloat16 || is_fp32(s.compensation)) &&
                    s.compensation.device() == s.param.device(),
                "update_parameter: kahan needs a compensation (bf16 or fp32) of the parameter's shape");
}

/// Writes `w32` (the fp32 result, `old32` the weight before) into `param_part` by the rule
/// and counts what rounding lost. `first` is the part's first element in the parameter.
amp::LostUpdates write_weight(Tensor param_part, Tensor& w32, const Tensor& old32, Tensor comp_part,
                              amp::WeightUpdate rule, uint64_t seed, uint64_t stream, uint64_t first,
                              amp::LostUpdates* spans) {
  amp::LostUpdates s;
  const auto dtype = param_part.scalar_type();
  if (dtype == torch::kFloat) {
    s.elements = w32.numel();  // updated in place; nothing rounded
    return s;
  }
  if (dtype == torch::kBFloat16) {
    const bool kahan = rule == amp::WeightUpdate::kKahan;
    Tensor comp32 = kahan ? comp_part.to(torch::kFloat).contiguous() : Tensor();
    if (w32.is_cpu()) {
      TORCH_INTERNAL_ASSERT(w32.is_contiguous() && old32.is_contiguous());
      // round_update's spans, each counted on its own (into `spans` when the caller sums them).
      float* w = w32.data_ptr<float>();
      const float* old = old32.data_ptr<float>();
      float* comp = kahan ? comp32.data_ptr<float>() : nullptr;
      const int64_t n = w32.numel();
      for (int64_t lo = 0, j = 0; lo < n; lo += amp::kUpdateChunk, ++j) {
        const int64_t len = std::min(amp::kUpdateChunk, n - lo);
        const amp::LostUpdates span = amp::round_update_span(w + lo, old + lo, comp ? comp + lo : nullptr, len,
                                                             first + static_cast<uint64_t>(lo), rule, seed, stream);
        if (spans)
          spans[j] = span;
        else
          s += span;
      }
    } else {
      TORCH_INTERNAL_ASSERT(first == 0);  // another device: the whole tensor is one part
      s = amp::round_update(w32, old32, rule, kahan ? &comp32 : nullptr, seed, stream);
    }
    param_part.copy_(w32);  // bf16 values already: exact
    if (kahan && !comp32.is_same(comp_part)) comp_part.copy_(comp32);
    return s;
  }
  // fp16, nearest: torch's own conversion, and the same counts.
  param_part.copy_(w32);
  const Tensor out = param_part.to(torch::kFloat);
  const Tensor u = w32 - old32;
  const Tensor intended = u != 0;
  s.elements = w32.numel();
  s.intended = intended.sum().item<int64_t>();
  s.lost = (intended & (out == old32)).sum().item<int64_t>();
  s.intended_sq = u.to(torch::kDouble).square().sum().item<double>();
  s.lost_sq = (w32 - out).to(torch::kDouble).square().sum().item<double>();
  return s;
}

/// The step on one part of the flattened tensors (a chunk, or the whole of a strided or
/// non-CPU tensor): fp32 copies of whatever is not fp32, the ops, each written back once.
amp::LostUpdates step_part(const UpdateRule& r, const ParamStep& s, amp::WeightUpdate rule, uint64_t seed,
                           const Tensor& param, const Tensor& grad, const std::vector<Tensor>& state, const Tensor& comp,
                           uint64_t first, amp::LostUpdates* spans = nullptr) {
  const bool wide_param = is_fp32(param);
  Tensor w32 = wide_param ? param : param.to(torch::kFloat).contiguous();
  const Tensor old32 = wide_param ? Tensor() : w32.clone();
  std::vector<Tensor> st32;
  st32.reserve(state.size());
  for (const Tensor& t : state) st32.push_back(is_fp32(t) ? t : t.to(torch::kFloat));
  fp32_step(r, s.step, s.fresh_momentum, w32, is_fp32(grad) ? grad : grad.to(torch::kFloat), st32);
  for (size_t i = 0; i < state.size(); ++i)
    if (!st32[i].is_same(state[i])) state[i].copy_(st32[i]);  // to nearest, in the state's dtype
  if (wide_param) {
    amp::LostUpdates none;
    none.elements = param.numel();
    return none;
  }
  return write_weight(param, w32, old32, comp, rule, seed, s.stream, first, spans);
}

bool fused_dtype(const Tensor& t) {
  return t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16;
}

/// Adam and AdamW over contiguous CPU tensors of fp32 and bf16: the fused pass (cpu_pass.h).
/// Anything else (another device, strides, fp16) takes the ops above, whose numbers are
/// the same (tested).
bool takes_fused_adam(const UpdateRule& r, const Tensor& param, const Tensor& grad, const std::vector<Tensor>& state,
                      const Tensor& comp) {
  if (r.kind != OptimizerKind::kAdamW && r.kind != OptimizerKind::kAdam) return false;
  const auto fits = [](const Tensor& t) { return t.is_cpu() && t.is_contiguous() && fused_dtype(t); };
  bool all = fits(param) && fits(grad) && (!comp.defined() || fits(comp));
  for (const Tensor& t : state) all = all && fits(t) && t.scalar_type() == state[0].scalar_type();
  return all;
}

detail::Operand operand(const Tensor& t, int64_t first) {
  if (!t.defined()) return {};
  return {static_cast<char*>(t.data_ptr()) + first * t.element_size(), t.scalar_type() == torch::kBFloat16};
}

/// A parameter the fused Adam pass takes (detached), with its step's scalars.
struct FusedParam {
  const ParamStep* step;
  Tensor param, grad, comp;
  std::vector<Tensor> state;
  detail::AdamScalars scalars;
};

/// One piece of the fused pass: elements [lo, lo + len) of one parameter. A bf16 weight's
/// pieces are amp::kUpdateChunk spans (round_update_span counts span by span); an fp32
/// weight's are smaller, so that the threads' shares differ by a few microseconds.
struct FusedPiece {
  size_t param;
  int64_t lo, len;
};
constexpr int64_t kFp32Piece = amp::kUpdateChunk / 4;

/// An fp32 weight is written in place; a bf16 weight's span is computed into fp32 scratch
/// and rounded by round_update_span there (its counts, bit for bit), then stored.
amp::LostUpdates fused_piece(const UpdateRule& r, const FusedParam& f, int64_t lo, int64_t len, amp::WeightUpdate rule,
                             uint64_t seed, std::vector<float>& scratch) {
  const detail::Operand p = operand(f.param, lo);
  const detail::Operand max_sq = r.amsgrad ? operand(f.state[2], lo) : detail::Operand{};
  if (f.param.scalar_type() != torch::kBFloat16) {
    detail::adam_span(f.scalars, len, p, operand(f.grad, lo), operand(f.state[0], lo), operand(f.state[1], lo), max_sq,
                      nullptr, nullptr);
    return {};
  }
  constexpr int64_t kSpan = amp::kUpdateChunk;
  if (scratch.size() < static_cast<size_t>(3 * kSpan)) scratch.resize(static_cast<size_t>(3 * kSpan));
  const bool bf16_comp = f.comp.defined() && f.comp.scalar_type() == torch::kBFloat16;
  float* fresh = scratch.data();
  float* old = fresh + kSpan;
  float* c = nullptr;
  if (f.comp.defined()) {
    c = bf16_comp ? old + kSpan : static_cast<float*>(operand(f.comp, lo).data);
    if (bf16_comp) detail::load_bf16(operand(f.comp, lo).data, c, len);
  }
  detail::adam_span(f.scalars, len, p, operand(f.grad, lo), operand(f.state[0], lo), operand(f.state[1], lo), max_sq,
                    fresh, old);
  const amp::LostUpdates counts =
      amp::round_update_span(fresh, old, c, len, static_cast<uint64_t>(lo), rule, seed, f.step->stream);
  detail::store_bf16(fresh, p.data, len);
  if (bf16_comp) detail::store_bf16(c, operand(f.comp, lo).data, len);
  return counts;
}

/// The fused Adam pass over every parameter at once: one parallel region for the step, its
/// pieces shared between the threads (a region per tensor costs about 20 us each to start
/// and join, and leaves a thread idle at each tensor's end). Each piece writes only its
/// own elements and counts; a parameter's counts are summed in its pieces' order, so the
/// numbers and counts depend neither on the thread count nor on the other parameters.
std::vector<amp::LostUpdates> fused_adam(const UpdateRule& r, const std::vector<FusedParam>& params,
                                         amp::WeightUpdate rule, uint64_t seed) {
  std::vector<FusedPiece> pieces;
  std::vector<size_t> first_piece(params.size() + 1);
  for (size_t i = 0; i < params.size(); ++i) {
    first_piece[i] = pieces.size();
    const int64_t n = params[i].param.numel();
    const int64_t size = params[i].param.scalar_type() == torch::kBFloat16 ? amp::kUpdateChunk : kFp32Piece;
    for (int64_t lo = 0; lo < n; lo += size) pieces.push_back({i, lo, std::min(size, n - lo)});
  }
  first_piece[params.size()] = pieces.size();
  std::vector<amp::LostUpdates> counts(pieces.size());
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t j0, int64_t j1) {
    // Kept per thread: a fresh 384 KiB block per call would be mapped and faulted in each time.
    thread_local std::vector<float> scratch;
    for (int64_t j = j0; j < j1; ++j) {
      const FusedPiece& piece = pieces[static_cast<size_t>(j)];
      counts[static_cast<size_t>(j)] = fused_piece(r, params[piece.param], piece.lo, piece.len, rule, seed, scratch);
    }
  });
  std::vector<amp::LostUpdates> out(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    for (size_t j = first_piece[i]; j < first_piece[i + 1]; ++j) out[i] += counts[j];
    if (params[i].param.scalar_type() != torch::kBFloat16) out[i].elements = params[i].param.numel();  // nothing rounded
  }
  return out;
}

/// update_parameter past its check, for a parameter the fused pass does not take.
amp::LostUpdates step_by_ops(const UpdateRule& rule, ParamStep& s, amp::WeightUpdate weight_update, uint64_t seed,
                             const Tensor& param, const Tensor& grad, std::vector<Tensor> state,
                             const Tensor& comp) {
  const bool kahan = comp.defined();
  bool all_fp32 = is_fp32(param) && is_fp32(grad);
  for (const Tensor& t : state) all_fp32 = all_fp32 && is_fp32(t);
  if (all_fp32) {
    // torch's own step on the tensors themselves.
    Tensor p = param;
    fp32_step(rule, s.step, s.fresh_momentum, p, grad, state);
    amp::LostUpdates none;
    none.elements = param.numel();
    return none;
  }

  bool chunked = param.is_cpu() && param.is_contiguous() && grad.is_contiguous() && (!kahan || comp.is_contiguous());
  for (const Tensor& t : state) chunked = chunked && t.is_contiguous();
  if (!chunked) return step_part(rule, s, weight_update, seed, param, grad, state, comp, 0);

  // Chunks of amp::kUpdateChunk elements, in parallel, each counted on its own and summed
  // in order: the numbers and counts do not depend on the thread count, and the counts
  // are round_update's on the same values.
  const int64_t n = param.numel();
  const Tensor flat_param = param.view(-1), flat_grad = grad.view(-1);
  std::vector<Tensor> flat_state;
  for (const Tensor& t : state) flat_state.push_back(t.view(-1));
  const Tensor flat_comp = kahan ? comp.view(-1) : Tensor();
  // Compute chunks of kComputeChunk elements (fewer dispatches), counted in spans of
  // amp::kUpdateChunk and summed in the spans' order, as round_update sums them.
  constexpr int64_t kComputeChunk = 4 * amp::kUpdateChunk;  // 131072: 8x and 16x were slower here (cache)
  const int64_t chunks = (n + kComputeChunk - 1) / kComputeChunk;
  std::vector<amp::LostUpdates> parts(static_cast<size_t>((n + amp::kUpdateChunk - 1) / amp::kUpdateChunk));
  const bool rounds = param.scalar_type() == torch::kBFloat16;  // counted span by span (fp16 and fp32: as a whole)
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    torch::NoGradGuard worker_no_grad;  // grad mode is per thread
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = c * kComputeChunk, len = std::min(kComputeChunk, n - lo);
      std::vector<Tensor> st;
      st.reserve(flat_state.size());
      for (const Tensor& t : flat_state) st.push_back(t.narrow(0, lo, len));
      amp::LostUpdates* spans = parts.data() + lo / amp::kUpdateChunk;
      const amp::LostUpdates whole =
          step_part(rule, s, weight_update, seed, flat_param.narrow(0, lo, len), flat_grad.narrow(0, lo, len), st,
                    kahan ? flat_comp.narrow(0, lo, len) : Tensor(), static_cast<uint64_t>(lo), rounds ? spans : nullptr);
      if (!rounds) spans[0] = whole;
    }
  });
  amp::LostUpdates total;
  for (const auto& p : parts) total += p;
  return total;
}

} // namespace

std::vector<amp::LostUpdates> update_parameters(const UpdateRule& rule, std::vector<ParamStep>& steps,
                                                amp::WeightUpdate weight_update, uint64_t seed) {
  for (const ParamStep& s : steps) check(rule, s, weight_update);  // all, before any weight moves
  torch::NoGradGuard no_grad;
  std::vector<amp::LostUpdates> out(steps.size());
  std::vector<FusedParam> fused;
  std::vector<size_t> fused_index;
  for (size_t i = 0; i < steps.size(); ++i) {
    ParamStep& s = steps[i];
    // Detached: the parts below are views and copies with no autograd history, on any thread.
    // A tensor that takes no gradient (the grad, the state, as a rule) has none to cut: the
    // detach would be one more op dispatched and one more TensorImpl a tensor, each step.
    const auto unlinked = [](const Tensor& t) { return t.defined() && t.requires_grad() ? t.detach() : t; };
    const Tensor param = s.param.detach(), grad = unlinked(s.grad);
    std::vector<Tensor> state;
    for (const Tensor& t : s.state) state.push_back(unlinked(t));
    const bool kahan = s.param.scalar_type() == torch::kBFloat16 && weight_update == amp::WeightUpdate::kKahan;
    const Tensor comp = kahan ? unlinked(s.compensation) : Tensor();
    if (takes_fused_adam(rule, param, grad, state, comp)) {
      fused.push_back({&s, param, grad, comp, std::move(state), detail::adam_scalars(rule, s.step)});
      fused_index.push_back(i);
    } else {
      out[i] = step_by_ops(rule, s, weight_update, seed, param, grad, std::move(state), comp);
    }
  }
  if (!fused.empty()) {
    const std::vector<amp::LostUpdates> counts = fused_adam(rule, fused, weight_update, seed);
    for (size_t k = 0; k < fused.size(); ++k) out[fused_index[k]] = counts[k];
  }
  return out;
}

amp::LostUpdates update_parameter(const UpdateRule& rule, ParamStep& s, amp::WeightUpdate weight_update, uint64_t seed) {
  std::vector<ParamStep> one{s};
  return update_parameters(rule, one, weight_update, seed)[0];
}

} // namespace mixtrain::optim
