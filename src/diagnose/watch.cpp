#include "mixtrain/diagnose/watch.h"

#include "util/short_number.h"

#include "mixtrain/amp/grad_scaler.h"
#include "mixtrain/amp/op_trace.h"
#include "mixtrain/amp/weight_update.h"
#include "mixtrain/diagnose/plots.h"
#include "mixtrain/models/module_scope.h"
#include "mixtrain/optim/optimizers.h"
#include "mixtrain/util/option_error.h"
#include "mixtrain/util/warnings.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Half.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace mixtrain::diagnose {

namespace {

std::string format(const char* fmt, double value) {
  char out[64];
  std::snprintf(out, sizeof(out), fmt, value);
  return out;
}

std::string joined(const std::vector<std::string>& items, size_t most) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < most; ++i) out += (i ? ", " : "") + items[i];
  return out;
}

std::vector<std::string> scale_evidence(const WatchEvidence& e) {
  if (e.scales.empty()) return {};
  const WatchSkips skips = watch_skips(e);
  return {std::to_string(skips.steps.size()) + " of " + std::to_string(e.scales.size()) + " steps skipped (" +
          std::to_string(skips.settling) + " while the scale settled from " + mixtrain::detail::short_number(e.initial_scale) +
          "); loss scale now " + mixtrain::detail::short_number(e.scales.back())};
}

} // namespace

WatchSkips watch_skips(const WatchEvidence& e) {
  WatchSkips out;
  double previous = e.initial_scale;
  for (size_t i = 0; i < e.scales.size(); ++i) {
    if (e.scales[i] < previous) out.steps.push_back(static_cast<int64_t>(i));  // false while previous is NaN
    previous = e.scales[i];
  }
  while (out.settling < static_cast<int64_t>(out.steps.size()) && out.steps[out.settling] == out.settling) ++out.settling;
  return out;
}

WatchReport judge_watch(const WatchEvidence& e) {
  WatchReport r;
  r.steps = e.steps;
  // forward_overflow: the first module, in forward order, on the first sampled step where one came near.
  for (const auto& sample : e.ranges)
    for (const auto& m : sample.modules) {
      if (m.largest < kNearOverflow * m.limit) continue;  // false for NaN: a NaN output is an overflow
      const std::string what = !std::isfinite(m.largest)
                                   ? "overflowed (not finite)"
                                   : "reached " + mixtrain::detail::short_number(m.largest) + ", " + format("%.0f", 100 * m.largest / m.limit) + "% of";
      r.verdict = "forward_overflow";
      r.evidence.push_back("module " + m.module + "'s output " + what + " its dtype's largest value " + mixtrain::detail::short_number(m.limit) +
                           " on step " + std::to_string(sample.step) + " (sampled every " + std::to_string(e.every) +
                           " steps; the first module in forward order to come within " +
                           format("%.0f", 1 / kNearOverflow) + "x)");
      for (auto& line : scale_evidence(e)) r.evidence.push_back(std::move(line));
      r.cure = {{"keep_fp32", m.module}};
      return r;
    }

  if (!e.scales.empty()) {
    const WatchSkips skips = watch_skips(e);
    const int64_t after = static_cast<int64_t>(e.scales.size()) - skips.settling;
    const double rate = after > 0 ? double(static_cast<int64_t>(skips.steps.size()) - skips.settling) / after : 0.0;
    const double lowest = *std::min_element(e.scales.begin(), e.scales.end());
    // A fall, not a small start: a scale that began at 2^-20 by choice has not collapsed.
    const bool collapsed = lowest <= 1.0 && !(lowest >= e.initial_scale);
    if (collapsed || (after >= 8 && rate >= kSkipRateMost)) {
      r.verdict = "gradient_overflow";
      if (collapsed)
        r.evidence.push_back("the loss scale collapsed: repeated back-off from " + mixtrain::detail::short_number(e.initial_scale) + " down to " +
                             mixtrain::detail::short_number(lowest));
      for (auto& line : scale_evidence(e)) r.evidence.push_back(std::move(line));
      if (!e.nonfinite_grads.empty())
        r.evidence.push_back("gradients not finite on step " + std::to_string(e.nonfinite_grads.front().step) + " in: " +
                             joined(e.nonfinite_grads.front().params, 5));
      r.cure = {{"clip", "1"}, {"precision", "bf16"}};
      return r;
    }
  }

  int64_t intended = 0, lost = 0;
  for (const auto& c : e.lost) {
    intended += c.intended;
    lost += c.lost;
  }
  const double share = intended > 0 ? double(lost) / intended : 0.0;
  if (intended > 0 && e.weight_update == "nearest" && share >= kLostUpdatesMost) {
    std::vector<std::pair<double, std::string>> worst;
    for (const auto& c : e.lost)
      if (c.intended > 0) worst.emplace_back(double(c.lost) / c.intended, c.param);
    std::sort(worst.begin(), worst.end(), [](const auto& a, const auto& b) { return a > b; });
    std::vector<std::string> named;
    for (size_t i = 0; i < worst.size() && i < 5; ++i) named.push_back(worst[i].second + " " + format("%.0f", 100 * worst[i].first) + "%");
    r.verdict = "lost_updates";
    r.evidence = {format("%.1f", 100 * share) + "% of the 16-bit weights' element updates rounded to no change (" + e.lost_counted + ")",
                  "most lost: " + joined(named, named.size())};
    r.cure = {{"weight_update", "stochastic"}};
    return r;
  }

  r.evidence = scale_evidence(e);
  if (intended > 0)
    r.evidence.push_back(format("%.1f", 100 * share) + "% of the 16-bit weights' element updates rounded to no change (rule '" +
                         e.weight_update + "')");
  else if (e.lost.empty() && !e.lost_counted.empty())
    r.evidence.push_back(e.lost_counted);
  double peak = -1;
  for (const auto& sample : e.ranges)
    for (const auto& m : sample.modules)
      if (!std::isnan(m.largest)) peak = std::max(peak, m.largest);
  if (peak >= 0) r.evidence.push_back("largest module output on the sampled steps: " + mixtrain::detail::short_number(peak));
  return r;
}

std::vector<std::string> cpp_loop_lines(const std::vector<Setting>& settings, bool ours) {
  std::vector<std::string> lines;
  for (const auto& s : settings) {
    if (s.key == "keep_fp32") {
      lines.push_back("auto islands = mixtrain::amp::keep_fp32(*model, {\"" + s.value + "\"});  // once, before the loop");
    } else if (s.key == "precision" && s.value == "bf16") {
      lines.push_back("mixtrain::amp::autocast guard(device, torch::kBFloat16);  // around the forward and loss; no GradScaler "
                      "(fp32's exponent range)");
    } else if (s.key == "clip") {
      lines.push_back("scaler.unscale_(opt); torch::nn::utils::clip_grad_norm_(model->parameters(), " + s.value +
                      ");  // before scaler.step(opt)");
    } else if (s.key == "weight_update") {
      const std::string rule = s.value == "stochastic" ? "kStochastic" : s.value == "kahan" ? "kKahan" : "kNearest";
      const std::string rounding = "mixtrain::optim::Rounding().weight_update(mixtrain::amp::WeightUpdate::" + rule + ")";
      lines.push_back(ours ? "opt.set_rounding(" + rounding + ");  // mixtrain's optimizer already: only its rounding changes"
                           : "mixtrain::optim::AdamW opt(model->parameters(), options, " + rounding +
                                 ");  // mixtrain::optim's AdamW (or Adam, SGD, RMSprop, Adagrad) in place of libtorch's");
    } else {
      lines.push_back("set " + s.key + " = " + s.value);
    }
  }
  return lines;
}

// ---- Watch

namespace {

std::mutex watched_mutex;
std::set<const torch::nn::Module*>& watched_models() {
  static std::set<const torch::nn::Module*> models;
  return models;
}

/// The largest finite value of the dtype an op's output is computed in, or 0 when it is
/// not a 16-bit computation: fp16/bf16's own; fp16's for an fp32 result of an op that ran
/// in fp16 (CPU emulation) or under fp16 autocast (the next op casts it).
double limit_of(const torch::Tensor& t, bool ran_reduced) {
  if (t.scalar_type() == torch::kHalf) return 65504.0;
  if (t.scalar_type() == torch::kBFloat16) return static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
  if (t.scalar_type() != torch::kFloat) return 0;
  if (ran_reduced) return 65504.0;
  const auto device = t.device().type();
  if (at::autocast::is_autocast_enabled(device) && at::autocast::get_autocast_dtype(device) == at::kHalf) return 65504.0;
  return 0;
}

} // namespace

struct ModuleRangeTracer::Observer : amp::OpObserver {
  std::unordered_map<const void*, std::string> owners;  // parameter -> its module's path
  std::vector<torch::Tensor> params;                     // alive, so their addresses stay theirs
  std::unordered_map<const void*, std::string> casts;    // this run's casts of parameters
  std::vector<torch::Tensor> keep;
  std::unordered_map<std::string, size_t> index;
  std::vector<Range> modules;
  std::unique_ptr<amp::OpTraceScope> scope;
  std::thread::id thread;                  // the one whose ops it sees (the scope is that thread's)
  std::atomic<bool> detached{false};       // left installed on a thread it could not be removed from

  void on_op(const std::string& name, c10::ArrayRef<c10::IValue> inputs, c10::ArrayRef<c10::IValue> outputs,
             c10::ArrayRef<c10::IValue> results, bool ran_reduced) override {
    if (detached.load(std::memory_order_relaxed) || !at::GradMode::is_enabled()) return;  // backward: gradients
    std::string owner;  // the module whose parameter (or a cast of one) the op reads
    amp::for_each_tensor(inputs, [&](const torch::Tensor& t) {
      if (!owner.empty()) return;
      if (auto it = owners.find(t.unsafeGetTensorImpl()); it != owners.end()) owner = it->second;
      else if (auto cast = casts.find(t.unsafeGetTensorImpl()); cast != casts.end()) owner = cast->second;
    });
    if (!owner.empty() && amp::is_cast_or_view(name)) {
      // autocast's fp16 copy of a weight (or its transpose) still belongs to its module.
      amp::for_each_tensor(results, [&](const torch::Tensor& t) {
        casts[t.unsafeGetTensorImpl()] = owner;
        keep.push_back(t);
      });
      return;
    }
    std::string module = current_module_path();
    if (module.empty()) module = owner;
    if (module.empty()) return;  // a top-level op of no module (the loss)
    amp::for_each_tensor(outputs, [&](const torch::Tensor& t) {
      if (!t.is_floating_point() || t.numel() == 0) return;
      const double limit = limit_of(t, ran_reduced);
      if (limit == 0) return;
      torch::NoGradGuard no_grad;
      const torch::Tensor largest = t.detach().abs().amax().to(torch::kFloat);
      auto [it, fresh] = index.emplace(module, modules.size());
      if (fresh) {
        modules.push_back({module, largest, limit});
      } else {
        Range& r = modules[it->second];
        r.largest = torch::maximum(r.largest, largest);  // NaN stays NaN
        r.limit = std::min(r.limit, limit);
      }
    });
  }
};

ModuleRangeTracer::ModuleRangeTracer(const std::vector<std::pair<std::string, torch::Tensor>>& named_params)
    : observer_(std::make_unique<Observer>()) {
  for (const auto& [name, p] : named_params) {
    const auto dot = name.rfind('.');
    observer_->owners.emplace(p.unsafeGetTensorImpl(), dot == std::string::npos ? "" : name.substr(0, dot));
    observer_->params.push_back(p);
  }
}

ModuleRangeTracer::~ModuleRangeTracer() {
  if (!observer_->scope || observer_->thread == std::this_thread::get_id()) return;
  // Destroyed on another thread than the one it sees: that thread's scope cannot be removed
  // from here. The observer stays, inert, where the thread's dispatcher still points.
  observer_->detached = true;
  (void)observer_->scope.release();
  (void)observer_.release();
}

void ModuleRangeTracer::start() {
  if (observer_->scope) return;
  observer_->scope = std::make_unique<amp::OpTraceScope>(observer_.get());
  observer_->thread = std::this_thread::get_id();
}

bool ModuleRangeTracer::running() const { return observer_->scope != nullptr; }

std::vector<ModuleRangeTracer::Range> ModuleRangeTracer::stop() {
  // A thread's op tracing is its own: only the thread that started it can end it.
  TORCH_CHECK(!observer_->scope || observer_->thread == std::this_thread::get_id(),
              "the watch's sampled step began on another thread: make the watch on the thread that trains, and call "
              "after_step there");
  observer_->scope.reset();
  observer_->casts.clear();
  observer_->keep.clear();
  observer_->index.clear();
  std::vector<Range> out;
  out.swap(observer_->modules);
  return out;
}

struct Watch::State {
  torch::nn::Module& model;
  torch::optim::Optimizer& optimizer;
  amp::GradScaler* scaler;
  int64_t every;
  optim::RoundedSteps* ours;
  std::vector<std::pair<std::string, torch::Tensor>> named;  // trainable parameters
  std::vector<std::string> optimizer_names;                  // the optimizer's parameters, in its order
  std::vector<amp::LostUpdates> lost_before;                 // ours: the counts at the last step
  std::map<std::string, std::pair<int64_t, int64_t>> lost;   // name -> intended, lost
  WatchEvidence evidence;
  // What the device holds until the block's read.
  struct PendingSample {
    int64_t step;
    std::vector<ModuleRangeTracer::Range> modules;
  };
  std::vector<PendingSample> samples;
  struct PendingGrads {
    int64_t step;
    std::vector<std::string> names;
    torch::Tensor flags;
  };
  std::vector<PendingGrads> grads;
  int64_t overflow_steps_noted = 0;
  std::unique_ptr<ModuleRangeTracer> ranges;  // on a sampled step
  // A libtorch optimizer's lost updates, on sampled steps: the 16-bit weights before the
  // step (aligned with `named`; undefined where not 16-bit), and per counted step the
  // [intended, lost] counts of each, kept on the device until the block's read.
  bool count_by_copy = false;
  std::vector<torch::Tensor> before;
  struct PendingLost {
    std::vector<std::string> names;
    torch::Tensor counts;
  };
  std::vector<PendingLost> pending_lost;
  WatchReport report;
  bool read_once = false, warned = false, closed = false;

  /// The weights whose updates can round away: bf16 and fp16 storage.
  static bool sixteen_bit(const torch::Tensor& p) {
    return p.scalar_type() == torch::kBFloat16 || p.scalar_type() == torch::kHalf;
  }

  State(torch::nn::Module& m, torch::optim::Optimizer& o, amp::GradScaler* s, int64_t n)
      : model(m), optimizer(o), scaler(s), every(n), ours(dynamic_cast<optim::RoundedSteps*>(&o)) {}

  void arm() { ranges->start(); }
  void disarm(bool keep) {
    if (!ranges->running()) return;
    auto modules = ranges->stop();
    if (keep) samples.push_back({evidence.steps, std::move(modules)});
  }

  void count_lost() {
    if (!ours) return;
    const auto& now = ours->lost_updates_per_param();
    if (lost_before.size() != now.size()) lost_before.assign(now.size(), {});
    size_t i = 0;
    for (const auto& group : optimizer.param_groups())
      for (const auto& p : group.params()) {
        if (i >= now.size()) break;
        const auto before = now[i].intended < lost_before[i].intended ? amp::LostUpdates{} : lost_before[i];  // lost_updates() restarted it
        if (sixteen_bit(p)) {
          auto& c = lost[i < optimizer_names.size() ? optimizer_names[i] : std::to_string(i)];
          c.first += now[i].intended - before.intended;
          c.second += now[i].lost - before.lost;
        }
        ++i;
      }
    lost_before = now;
  }

  /// Before a sampled step (libtorch's optimizers): a copy of each 16-bit weight.
  void copy_weights() {
    if (!count_by_copy) return;
    torch::NoGradGuard no_grad;
    before.clear();
    for (const auto& [name, p] : named)
      before.push_back(sixteen_bit(p) ? p.detach().clone() : torch::Tensor());
  }

  /// After the sampled step: each 16-bit weight's elements with a nonzero gradient
  /// (intended), and those of them the step left unchanged (lost); a step the scaler skipped
  /// changed nothing on purpose and is not counted.
  void count_unchanged(bool skipped) {
    if (before.empty()) return;
    if (!skipped) {
      torch::NoGradGuard no_grad;
      PendingLost out;
      std::vector<torch::Tensor> counts;
      for (size_t i = 0; i < named.size(); ++i) {
        const torch::Tensor& p = named[i].second;
        if (!before[i].defined() || !p.grad().defined()) continue;
        const torch::Tensor moved = p.grad().ne(0);
        out.names.push_back(named[i].first);
        counts.push_back(torch::stack({moved.sum(), moved.logical_and(p.eq(before[i])).sum()}));
      }
      if (!counts.empty()) {
        out.counts = torch::stack(counts);
        pending_lost.push_back(std::move(out));
      }
    }
    before.clear();
  }

  void note_nonfinite_grads() {
    std::vector<std::string> names;
    std::vector<torch::Tensor> flags;
    torch::NoGradGuard no_grad;
    for (const auto& [name, p] : named)
      if (p.grad().defined()) {
        names.push_back(name);
        flags.push_back(torch::isfinite(p.grad()).logical_not().any());
      }
    if (!flags.empty()) grads.push_back({evidence.steps, std::move(names), torch::stack(flags)});
  }

  /// The block's one host read: the sampled ranges and the gradient flags, in one transfer.
  void read() {
    std::vector<torch::Tensor> parts;
    for (const auto& s : samples)
      for (const auto& m : s.modules) parts.push_back(m.largest.reshape({1}).to(torch::kDouble));
    for (const auto& g : grads) parts.push_back(g.flags.to(torch::kDouble));
    for (const auto& l : pending_lost) parts.push_back(l.counts.flatten().to(torch::kDouble));
    std::vector<double> values;
    if (!parts.empty()) {
      const torch::Tensor all = torch::cat(parts).cpu().contiguous();
      values.assign(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
    }
    size_t at = 0;
    for (auto& s : samples) {
      WatchEvidence::Sample out{s.step, {}};
      for (const auto& m : s.modules) out.modules.push_back({m.module, values[at++], m.limit});
      evidence.ranges.push_back(std::move(out));
    }
    samples.clear();
    for (auto& g : grads) {
      WatchEvidence::NonfiniteGrads out{g.step, {}};
      for (const auto& name : g.names)
        if (values[at++] != 0) out.params.push_back(name);
      if (!out.params.empty()) evidence.nonfinite_grads.push_back(std::move(out));
    }
    grads.clear();
    for (const auto& l : pending_lost)
      for (const auto& name : l.names) {
        auto& c = lost[name];
        c.first += static_cast<int64_t>(values[at++]);
        c.second += static_cast<int64_t>(values[at++]);
      }
    pending_lost.clear();
    evidence.lost.clear();
    for (const auto& [name, c] : lost) evidence.lost.push_back({name, c.first, c.second});
    if (ours) evidence.weight_update = amp::weight_update_name(ours->rounding().weight_update());
    report = judge_watch(evidence);
    read_once = true;
    if (report.verdict != "healthy" && !warned) {
      warned = true;
      std::string message = "mixtrain watch: " + report.verdict + ": " + report.evidence.front();
      const auto lines = cpp_loop_lines(report.cure, ours != nullptr);
      if (!lines.empty()) message += "; try: " + lines.front();
      warn(message);
    }
  }
};

Watch::Watch(torch::nn::Module& model, torch::optim::Optimizer& optimizer, amp::GradScaler* scaler, WatchOptions options) {
  check_option(options.every() >= 1, "every", options.every(), "must be >= 1 (one step in every N is sampled and read)");
  auto state = std::make_unique<State>(model, optimizer, scaler, options.every());
  std::unordered_map<const void*, std::string> names;
  std::vector<std::pair<std::string, torch::Tensor>> all;
  for (const auto& kv : model.named_parameters(/*recurse=*/true)) {
    all.emplace_back(kv.key(), kv.value());
    names.emplace(kv.value().unsafeGetTensorImpl(), kv.key());
    if (kv.value().requires_grad()) state->named.emplace_back(kv.key(), kv.value());
  }
  if (state->named.empty()) throw OptionError("model", Phrase("the model has no trainable parameters: there is nothing to watch"));
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      const auto it = names.find(p.unsafeGetTensorImpl());
      state->optimizer_names.push_back(it != names.end() ? it->second : "?");
    }
  state->ranges = std::make_unique<ModuleRangeTracer>(all);
  auto& e = state->evidence;
  e.every = options.every();
  if (scaler && scaler->is_enabled()) e.initial_scale = scaler->get_scale();
  else state->scaler = nullptr;
  bool any_sixteen_bit = false;
  for (const auto& [name, p] : state->named) any_sixteen_bit |= State::sixteen_bit(p);
  if (state->ours) {
    e.lost_counted = "every step, exact, from mixtrain::optim's update pass";
    state->lost_before = state->ours->lost_updates_per_param();
  } else if (any_sixteen_bit) {
    // libtorch's optimizers do not expose their update: on a sampled step the weights are
    // compared with a copy taken before it. Whether an element moved is exact; that its
    // update was meant to be nonzero is read from its gradient.
    state->count_by_copy = true;
    e.lost_counted = "on the sampled steps (1 in " + std::to_string(options.every()) +
                     "), the elements with a nonzero gradient whose 16-bit weight the step left unchanged, against a copy "
                     "taken before it (libtorch's optimizers do not expose their update; mixtrain::optim's count every step "
                     "exactly)";
  }
  // Registered last, so that a watch that fails to start leaves the model free.
  {
    std::lock_guard<std::mutex> lock(watched_mutex);
    if (!watched_models().insert(&model).second)
      throw OptionError("model", Phrase("this model is watched already: close() the first watch before watching it again"));
  }
  try {
    state->arm();  // the first step is sampled
    state->copy_weights();
  } catch (...) {
    std::lock_guard<std::mutex> lock(watched_mutex);
    watched_models().erase(&model);
    throw;
  }
  state_ = std::move(state);
}

Watch::~Watch() {
  try {
    close();
  } catch (...) {  // a destructor does not throw; close() said what it could
  }
}

void Watch::after_step() {
  State& s = *state_;
  if (s.closed) throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, "Watch::after_step after close()");
  s.disarm(/*keep=*/true);
  bool skipped = false;
  if (s.scaler) {
    const double scale = s.scaler->get_scale();  // the host mirror: no read
    const double previous = s.evidence.scales.empty() ? s.evidence.initial_scale : s.evidence.scales.back();
    skipped = scale < previous;  // the scaler backs off exactly when it skipped the step
    if (skipped && s.overflow_steps_noted < kWatchedOverflowSteps) {
      ++s.overflow_steps_noted;
      s.note_nonfinite_grads();
    }
    s.evidence.scales.push_back(scale);
  }
  s.count_lost();
  s.count_unchanged(skipped);
  ++s.evidence.steps;
  if (s.evidence.steps % s.every == 0) {
    s.read();
    s.arm();
    s.copy_weights();
  }
}

const WatchReport& Watch::report() {
  State& s = *state_;
  if (!s.closed && (s.evidence.steps % s.every != 0 || !s.read_once)) s.read();
  return s.report;
}

std::string Watch::report_text() {
  const WatchReport& r = report();
  std::ostringstream out;
  out << "mixtrain watch: " << r.verdict << " after " << r.steps << " step" << (r.steps == 1 ? "" : "s") << "\n";
  for (const auto& line : r.evidence) out << "  " << line << "\n";
  const auto lines = cpp_loop_lines(r.cure, state_->ours != nullptr);
  if (!lines.empty()) {
    out << "cure (the catalogue's first try; prove it with the doctor):\n";
    for (const auto& line : lines) out << "  " << line << "\n";
  }
  if (r.verdict != "healthy")
    out << "prove it: mixtrain.doctor(model, data, optimizer=opt" << (state_->scaler ? ", scaler=scaler" : "") << ", steps="
        << kWatchDoctorSteps << ") on this model as TorchScript, or mixtrain doctor --model model.pt --data data.pt\n";
  return out.str();
}

const WatchEvidence& Watch::evidence() {
  report();
  return state_->evidence;
}

std::string Watch::plot() {
  const WatchEvidence& e = evidence();
  if (e.scales.empty()) return "";
  RunEvidence run;
  run.precision = "fp16, watched";
  run.scales = e.scales;
  run.skipped.assign(e.scales.size(), false);
  for (const int64_t i : watch_skips(e).steps) run.skipped[i] = true;
  return scale_history_svg(run);
}

void Watch::close() {
  State& s = *state_;
  if (s.closed) return;
  s.closed = true;  // closed even when the tracer below cannot be ended from this thread
  {
    std::lock_guard<std::mutex> lock(watched_mutex);
    watched_models().erase(&s.model);
  }
  s.disarm(/*keep=*/false);
  s.read();
}

std::ostream& operator<<(std::ostream& out, Watch& watch) { return out << watch.report_text(); }

} // namespace mixtrain::diagnose
