// diagnose::Watch in plain libtorch loops, written as a user would: an fp16 loop whose
// activation drifts to overflow (forward_overflow at that module, before the first NaN), a
// loss scale that collapses (gradient_overflow, the history, the gradients named), a bf16
// model under mixtrain::optim's AdamW at a small lr (lost_updates, the optimizer's own exact
// count), healthy loops (healthy, no warning), the same weights watched or not, and bad input.
// judge_watch's rules are also tested alone: Python's mixtrain.watch asks the same function.

#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <cmath>
#include <map>
#include <optional>
#include <thread>

using namespace mixtrain;
using diagnose::judge_watch;
using diagnose::Watch;
using diagnose::WatchEvidence;
using diagnose::WatchOptions;

namespace {

struct WatchDriftingImpl : torch::nn::Module {
  torch::nn::Linear proj{nullptr}, head{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  WatchDriftingImpl() {
    proj = register_module("proj", torch::nn::Linear(16, 32));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
    head = register_module("head", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(norm(proj(x))); }
};
TORCH_MODULE(WatchDrifting);

std::pair<torch::Tensor, torch::Tensor> watch_data(int64_t n, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor x = torch::randn({n, 16}, g);
  auto g2 = at::make_generator<at::CPUGeneratorImpl>(9);
  return {x, torch::matmul(x.slice(1, 0, 4), torch::randn({4, 4}, g2)).argmax(1)};
}

/// torch's fp16 recipe on the CPU: autocast, then amp::GradScaler. Returns the first step whose
/// loss was not finite (nullopt if none). `extra` adds to the loss (a blow-up); `drift` runs after each step.
std::optional<int64_t> fp16_loop(WatchDrifting& model, torch::optim::Optimizer& opt, amp::GradScaler& scaler,
                                 const torch::Tensor& x, const torch::Tensor& y, int64_t steps, Watch* watch,
                                 const std::function<void()>& drift = nullptr, bool blow_up = false) {
  std::optional<int64_t> first_nan;
  const int64_t bs = 32;
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t at = i * bs % x.size(0);
    const torch::Tensor xb = x.slice(0, at, at + bs), yb = y.slice(0, at, at + bs);
    opt.zero_grad();
    torch::Tensor loss;
    {
      amp::autocast guard(torch::kCPU, torch::kHalf);
      const torch::Tensor out = model->forward(xb);
      loss = torch::nn::functional::cross_entropy(out.to(torch::kFloat), yb);
      if (blow_up) loss = loss + (out.to(torch::kFloat) * 1e38).sum() * 1e3;
    }
    if (!first_nan && !std::isfinite(loss.item<double>())) first_nan = i;
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    if (watch) watch->after_step();
    if (drift) {
      torch::NoGradGuard no_grad;
      drift();
    }
  }
  return first_nan;
}

WatchEvidence::Sample sample(int64_t step, std::vector<diagnose::ModuleRange> modules) { return {step, std::move(modules)}; }

} // namespace

class WatchTest : public test::SeededTest {};

TEST_F(WatchTest, TheRulesNameTheFirstModuleNearItsMaxACollapseAndLostUpdates) {
  WatchEvidence e;
  e.every = 5;
  e.steps = 20;
  e.initial_scale = 65536;
  e.scales.assign(20, 65536);
  e.ranges = {sample(0, {{"a", 100, 65504}, {"b", 200, 65504}}),
              sample(5, {{"a", 100, 65504}, {"b", 20000, 65504}, {"c", NAN, 65504}})};
  auto r = judge_watch(e);
  ASSERT_EQ(r.verdict, "forward_overflow");
  EXPECT_EQ(r.evidence[0], "module b's output reached 2e+04, 31% of its dtype's largest value 6.55e+04 on step 5 "
                           "(sampled every 5 steps; the first module in forward order to come within 4x)");
  ASSERT_EQ(r.cure.size(), 1u);
  EXPECT_EQ(r.cure[0].key, "keep_fp32");
  EXPECT_EQ(r.cure[0].value, "b");
  e.ranges[1].modules[1].largest = 16000;  // 24%: under the rule; the NaN output after it still is one
  r = judge_watch(e);
  EXPECT_EQ(r.verdict, "forward_overflow");
  EXPECT_NE(r.evidence[0].find("module c's output overflowed (not finite)"), std::string::npos) << r.evidence[0];
  e.ranges.pop_back();
  EXPECT_EQ(judge_watch(e).verdict, "healthy");

  // Three settling skips are no problem; a collapse to <= 1 is; so is half the settled steps skipped.
  e.scales = {32768, 16384, 8192};
  e.scales.resize(20, 8192);
  const auto skips = diagnose::watch_skips(e);
  EXPECT_EQ(skips.steps, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(skips.settling, 3);
  EXPECT_EQ(judge_watch(e).verdict, "healthy");
  for (size_t i = 4; i < 20; i += 2) e.scales[i] = e.scales[i - 1] / 2, e.scales[i + 1] = e.scales[i];
  r = judge_watch(e);
  EXPECT_EQ(r.verdict, "healthy") << r.evidence[0];  // 8 of the 17 settled steps skipped: 47%
  e.scales.resize(19);                                 // ... but 8 of 16 are half
  EXPECT_EQ(judge_watch(e).verdict, "gradient_overflow");
  e.scales.assign(20, 65536);
  e.scales.back() = 0.5;
  r = judge_watch(e);
  EXPECT_EQ(r.verdict, "gradient_overflow");
  EXPECT_EQ(r.evidence[0], "the loss scale collapsed: repeated back-off from 6.554e+04 down to 0.5");
  e.initial_scale = 0.25;  // a small start is no collapse
  e.scales.assign(20, 0.5);
  EXPECT_EQ(judge_watch(e).verdict, "healthy");

  // Lost updates: three quarters under nearest; none of it under stochastic rounding.
  e.scales.clear();
  e.ranges.clear();
  e.lost = {{"fc.weight", 1000, 760}, {"norm.weight", 100, 100}};
  e.lost_counted = "counted so";
  r = judge_watch(e);
  ASSERT_EQ(r.verdict, "lost_updates");
  EXPECT_EQ(r.evidence[0], "78.2% of the 16-bit weights' element updates rounded to no change (counted so)");
  EXPECT_EQ(r.evidence[1], "most lost: norm.weight 100%, fc.weight 76%");
  EXPECT_EQ(r.cure[0].value, "stochastic");
  e.lost[0].lost = 700;  // 72.7%: under the rule
  EXPECT_EQ(judge_watch(e).verdict, "healthy");
  e.lost[0].lost = 760;
  e.weight_update = "stochastic";
  r = judge_watch(e);
  EXPECT_EQ(r.verdict, "healthy");
  EXPECT_EQ(r.evidence.back(), "78.2% of the 16-bit weights' element updates rounded to no change (rule 'stochastic')");
}

TEST_F(WatchTest, AnActivationDriftingToFp16sMaxIsForwardOverflowAtItsModuleBeforeTheFirstNan) {
  WatchDrifting model;
  auto [x, y] = watch_data(512, 1);
  x = x * 20;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(1e-3));
  amp::GradScaler scaler;
  std::vector<std::string> said;
  std::optional<int64_t> first_nan;
  std::string text;
  int64_t onset = -1;
  {
    const WarningsTo to([&](const Phrase& w) { said.push_back(w.str()); });
    Watch watch(*model, opt, &scaler, WatchOptions().every(5));
    first_nan = fp16_loop(model, opt, scaler, x, y, 80, &watch, [&] { model->proj->weight.mul_(1.15); });
    text = watch.report_text();
    ASSERT_EQ(watch.report().verdict, "forward_overflow") << text;
    EXPECT_NE(watch.report().evidence[0].find("module proj's output"), std::string::npos) << text;
    for (const auto& s : watch.evidence().ranges)
      for (const auto& m : s.modules)
        if (onset < 0 && m.module == "proj" && !(m.largest < 65504 / 4.0)) onset = s.step;
  }
  ASSERT_TRUE(first_nan.has_value());  // the loop ends in NaN
  ASSERT_GE(onset, 0);
  EXPECT_LT(onset, *first_nan);  // seen while the range crossed, before the loss went NaN
  EXPECT_NE(text.find("auto islands = mixtrain::amp::keep_fp32(*model, {\"proj\"});"), std::string::npos) << text;
  ASSERT_EQ(said.size(), 1u);
  EXPECT_EQ(said[0].rfind("mixtrain watch: forward_overflow: module proj's output", 0), 0u) << said[0];
}

TEST_F(WatchTest, ACollapsingLossScaleIsGradientOverflowWithItsHistoryAndTheGradientsNamed) {
  WatchDrifting model;
  auto [x, y] = watch_data(256, 2);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(1e-3));
  amp::GradScaler scaler;
  const WarningsTo quiet([](const Phrase&) {});
  Watch watch(*model, opt, &scaler, WatchOptions().every(10));
  fp16_loop(model, opt, scaler, x, y, 40, &watch, nullptr, /*blow_up=*/true);
  const auto& report = watch.report();
  ASSERT_EQ(report.verdict, "gradient_overflow");
  EXPECT_EQ(report.evidence[0].rfind("the loss scale collapsed: repeated back-off from 6.554e+04 down to", 0), 0u);
  const auto& e = watch.evidence();
  ASSERT_EQ(e.scales.size(), 40u);
  EXPECT_EQ(e.scales.front(), 32768.0);
  EXPECT_LT(e.scales.back(), 1.0);
  EXPECT_EQ(diagnose::watch_skips(e).steps.size(), 40u);
  // Every overflowing step's gradients are checked, up to kWatchedOverflowSteps of them.
  ASSERT_EQ(e.nonfinite_grads.size(), static_cast<size_t>(diagnose::kWatchedOverflowSteps));
  EXPECT_EQ(e.nonfinite_grads[0].step, 0);
  EXPECT_TRUE(test::contains(e.nonfinite_grads[0].params, "head.weight"));
  EXPECT_NE(report.evidence.back().find("gradients not finite on step 0 in: "), std::string::npos);
  const std::string text = watch.report_text();
  EXPECT_NE(text.find("torch::nn::utils::clip_grad_norm_(model->parameters(), 1);"), std::string::npos) << text;
  const std::string chart = watch.plot();
  EXPECT_EQ(chart.rfind("<svg", 0), 0u);
  EXPECT_NE(chart.find("skipped step (40)"), std::string::npos);
}

TEST_F(WatchTest, ABf16ModelUnderMixtrainsAdamWAtASmallLrLosesUpdatesCountedExactly) {
  auto [x, y] = watch_data(512, 3);
  for (const auto rule : {amp::WeightUpdate::kNearest, amp::WeightUpdate::kStochastic}) {
    torch::manual_seed(0);
    WatchDrifting model;
    model->to(torch::kBFloat16);
    optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-5), optim::Rounding().weight_update(rule).seed(3));
    std::vector<std::string> said;
    const WarningsTo to([&](const Phrase& w) { said.push_back(w.str()); });
    Watch watch(*model, opt, nullptr, WatchOptions().every(10));
    for (int64_t i = 0; i < 30; ++i) {
      const int64_t at = i * 32 % x.size(0);
      opt.zero_grad();
      const torch::Tensor out = model->forward(x.slice(0, at, at + 32).to(torch::kBFloat16));
      torch::nn::functional::cross_entropy(out.to(torch::kFloat), y.slice(0, at, at + 32)).backward();
      opt.step();
      watch.after_step();
    }
    const auto& report = watch.report();
    const amp::LostUpdates counted = opt.lost_updates();  // the optimizer's own count, every step
    if (rule == amp::WeightUpdate::kNearest) {
      ASSERT_EQ(report.verdict, "lost_updates") << watch.report_text();
      char share[32];
      std::snprintf(share, sizeof(share), "%.1f%%", 100 * counted.fraction());
      EXPECT_EQ(report.evidence[0].rfind(std::string(share) + " of the 16-bit weights' element updates", 0), 0u) << report.evidence[0];
      EXPECT_NE(report.evidence[0].find("every step, exact, from mixtrain::optim's update pass"), std::string::npos);
      EXPECT_NE(report.evidence[1].find("norm.weight"), std::string::npos) << report.evidence[1];
      EXPECT_NE(watch.report_text().find("opt.set_rounding(mixtrain::optim::Rounding().weight_update("
                                         "mixtrain::amp::WeightUpdate::kStochastic));"),
                std::string::npos);
      EXPECT_EQ(said.size(), 1u);
    } else {
      EXPECT_EQ(report.verdict, "healthy") << watch.report_text();  // the same share, kept in expectation
      EXPECT_TRUE(said.empty());
    }
  }
}

// libtorch's own AdamW exposes no update: on the sampled steps (0, 10, 20) the watch counts, per
// 16-bit weight, the elements with a nonzero gradient and those of them the step left unchanged.
// The same loop unwatched, counted by hand on those steps, gives the same numbers.
TEST_F(WatchTest, ABf16ModelUnderLibtorchsAdamWCountsOnSampledStepsWhatEachStepLeftUnchanged) {
  auto [x, y] = watch_data(512, 3);
  std::map<std::string, std::pair<int64_t, int64_t>> by_hand, watched;
  for (const bool watch_it : {true, false}) {
    torch::manual_seed(0);
    WatchDrifting model;
    model->to(torch::kBFloat16);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-5));
    std::vector<std::string> said;
    const WarningsTo to([&](const Phrase& w) { said.push_back(w.str()); });
    std::optional<Watch> watch;
    if (watch_it) watch.emplace(*model, opt, nullptr, WatchOptions().every(10));
    for (int64_t i = 0; i < 30; ++i) {
      const int64_t at = i * 32 % x.size(0);
      std::vector<torch::Tensor> before;
      if (!watch_it && i % 10 == 0)
        for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
      opt.zero_grad();
      const torch::Tensor out = model->forward(x.slice(0, at, at + 32).to(torch::kBFloat16));
      torch::nn::functional::cross_entropy(out.to(torch::kFloat), y.slice(0, at, at + 32)).backward();
      opt.step();
      if (watch) watch->after_step();
      if (before.empty()) continue;
      size_t k = 0;
      for (const auto& named : model->named_parameters()) {
        const torch::Tensor moved = named.value().grad().ne(0);
        by_hand[named.key()].first += moved.sum().item<int64_t>();
        by_hand[named.key()].second += moved.logical_and(named.value().eq(before[k++])).sum().item<int64_t>();
      }
    }
    if (!watch_it) continue;
    const auto& report = watch->report();
    ASSERT_EQ(report.verdict, "lost_updates") << watch->report_text();
    EXPECT_NE(report.evidence[0].find("on the sampled steps (1 in 10), the elements with a nonzero gradient whose 16-bit "
                                      "weight the step left unchanged"),
              std::string::npos)
        << report.evidence[0];
    EXPECT_EQ(said.size(), 1u);
    for (const auto& c : watch->evidence().lost) watched[c.param] = {c.intended, c.lost};
  }
  EXPECT_EQ(watched, by_hand);
  int64_t intended = 0, lost = 0;
  for (const auto& [name, c] : by_hand) {
    intended += c.first;
    lost += c.second;
  }
  EXPECT_GT(intended, 0);
  EXPECT_GT(lost, intended * 3 / 4);  // lr 1e-5 in bf16: most updates round away
  EXPECT_LT(lost, intended);          // but not all: the count is not the trivial one
}

TEST_F(WatchTest, HealthyLoopsAreHealthyAndWatchedOrNotTheWeightsAreBitwiseTheSame) {
  auto [x, y] = watch_data(512, 6);
  torch::manual_seed(0);
  WatchDrifting base;
  std::vector<std::vector<torch::Tensor>> finals;
  for (const bool watched : {false, true}) {
    WatchDrifting model;
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < model->parameters().size(); ++i) model->parameters()[i].copy_(base->parameters()[i]);
    }
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
    amp::GradScaler scaler;
    std::vector<std::string> said;
    const WarningsTo to([&](const Phrase& w) { said.push_back(w.str()); });
    if (watched) {
      Watch watch(*model, opt, &scaler, WatchOptions().every(3));
      fp16_loop(model, opt, scaler, x, y, 20, &watch);
      EXPECT_EQ(watch.report().verdict, "healthy") << watch.report_text();
      EXPECT_TRUE(watch.report().cure.empty());
      EXPECT_EQ(watch.evidence().ranges.size(), 7u);  // steps 0, 3, ..., 18
    } else {
      fp16_loop(model, opt, scaler, x, y, 20, nullptr);
    }
    EXPECT_TRUE(said.empty());
    finals.emplace_back();
    for (const auto& p : model->parameters()) finals.back().push_back(p.detach().clone());
  }
  for (size_t i = 0; i < finals[0].size(); ++i) EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i])) << i;
}

TEST_F(WatchTest, BadInputIsOneLineAndCloseRemovesTheTracer) {
  WatchDrifting model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THROW(
      {
        try {
          Watch(*model, opt, nullptr, WatchOptions().every(0));
        } catch (const OptionError& e) {
          EXPECT_EQ(e.key(), "every");
          throw;
        }
      },
      OptionError);
  {
    Watch watch(*model, opt);
    EXPECT_TRUE(mixtrain::detail::ops_observed());  // the first step is sampled
    try {
      Watch again(*model, opt);
      FAIL() << "a second watch on the same model";
    } catch (const OptionError& e) {
      EXPECT_NE(std::string(e.what()).find("this model is watched already"), std::string::npos) << e.what();
    }
    watch.close();
    EXPECT_FALSE(mixtrain::detail::ops_observed());
    EXPECT_THROW(watch.after_step(), c10::Error);
  }
  Watch again(*model, opt);  // closed: it may be watched again
  again.close();
  WatchDrifting frozen;
  for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  try {
    Watch none(*frozen, opt);
    FAIL() << "a model with no trainable parameter";
  } catch (const OptionError& e) {
    EXPECT_NE(std::string(e.what()).find("no trainable parameters"), std::string::npos) << e.what();
  }
}

// A sampled step's tracer belongs to the thread that made the watch: after_step from another
// thread is a one-line error that changes nothing, and the watch still closes on its own.
TEST_F(WatchTest, AStepOnAnotherThreadIsAOneLineErrorThatChangesNothing) {
  WatchDrifting model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  {
    Watch watch(*model, opt);
    std::string error;
    std::thread([&] {
      try {
        watch.after_step();
      } catch (const c10::Error& e) {
        error = e.what_without_backtrace();
      }
    }).join();
    EXPECT_NE(error.find("make the watch on the thread that trains"), std::string::npos) << error;
    EXPECT_TRUE(mixtrain::detail::ops_observed());  // this thread's sampled step goes on
    watch.after_step();                            // here it is fine
    EXPECT_EQ(watch.report().steps, 1);
  }
  EXPECT_FALSE(mixtrain::detail::ops_observed());
  Watch again(*model, opt);  // the closed watch let the model go
}

namespace {
/// Counts the host reads the dispatcher sees while `counting` is set (test::reads_host).
class WatchHostReads : public amp::OpObserver {
 public:
  void on_op(const std::string& name, c10::ArrayRef<c10::IValue> inputs, c10::ArrayRef<c10::IValue>,
             c10::ArrayRef<c10::IValue>, bool) override {
    if (counting && test::reads_host(name, inputs)) ++reads;
  }
  bool counting = false;
  int64_t reads = 0;
};
} // namespace

// Between its reads (once a block, every=N) the watch adds no host read to a step: the scale
// and the skips come from the GradScaler's host mirror, the gradient flags wait on the device.
// Counted at the dispatcher over steps 1..19 (step 0 is sampled: its tracer takes the observer's place).
TEST_F(WatchTest, BetweenItsReadsTheWatchAddsNoHostReadToAStep) {
  auto [x, y] = watch_data(640, 7);  // 20 batches of 32
  std::vector<int64_t> counts;
  for (const bool watched : {false, true}) {
    torch::manual_seed(0);
    WatchDrifting model;
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
    amp::GradScaler scaler;
    WatchHostReads counter;
    const amp::OpTraceScope observe(&counter);
    std::optional<Watch> watch;
    if (watched) watch.emplace(*model, opt, &scaler, WatchOptions().every(1000));
    for (int64_t i = 0; i < 20; ++i) {
      counter.counting = i > 0;
      fp16_loop(model, opt, scaler, x.slice(0, 32 * i, 32 * i + 32), y.slice(0, 32 * i, 32 * i + 32), 1,
                watch ? &*watch : nullptr);
    }
    counter.counting = false;
    counts.push_back(counter.reads);
  }
  EXPECT_GT(counts[0], 0);  // the loop's own reads (its loss, the scaler's found_inf) are seen
  EXPECT_EQ(counts[1], counts[0]);
}
