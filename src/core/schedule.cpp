#include "mixtrain/core/schedule.h"

#include "mixtrain/core/optimizers.h"

#include "mixtrain/core/learner.h"

#include <torch/optim.h>

#include <cmath>
#include <numeric>

namespace mixtrain {

Schedule sched_cos(double start, double end) {
  return [=](double pos) { return start + (1 + std::cos(M_PI * (1 - pos))) * (end - start) / 2; };
}

Schedule sched_lin(double start, double end) {
  return [=](double pos) { return start + pos * (end - start); };
}

Schedule sched_const(double value) {
  return [=](double) { return value; };
}

Schedule combine_scheds(std::vector<double> pcts, std::vector<Schedule> scheds) {
  TORCH_CHECK(!pcts.empty() && pcts.size() == scheds.size(), "combine_scheds needs one pct per schedule");
  const double total = std::accumulate(pcts.begin(), pcts.end(), 0.0);
  TORCH_CHECK(std::abs(total - 1.0) < 1e-9, "combine_scheds: pcts must sum to 1 (got ", total, ")");
  for (double p : pcts) TORCH_CHECK(p >= 0, "combine_scheds: negative pct ", p);
  return [pcts = std::move(pcts), scheds = std::move(scheds)](double pos) {
    // Find the phase holding pos, then rescale pos to [0, 1) inside it.
    double start = 0;
    for (size_t i = 0; i < pcts.size(); ++i) {
      const double end = start + pcts[i];
      if (pos < end || i + 1 == pcts.size()) {
        const double local = pcts[i] > 0 ? (pos - start) / pcts[i] : 0.0;
        return scheds[i](std::min(std::max(local, 0.0), 1.0));
      }
      start = end;
    }
    return scheds.back()(1.0);
  };
}

Schedule combined_cos(double pct, double start, double middle, double end) {
  return combine_scheds({pct, 1 - pct}, {sched_cos(start, middle), sched_cos(middle, end)});
}

Schedule one_cycle_lr(double lr_max, const OneCycleOptions& o) {
  TORCH_CHECK(lr_max > 0, "Invalid lr_max: ", lr_max, " (must be > 0)");
  TORCH_CHECK(o.pct_start() >= 0 && o.pct_start() <= 1, "Invalid pct_start: ", o.pct_start(), " (must be in [0, 1])");
  TORCH_CHECK(o.div() > 0 && o.div_final() > 0, "Invalid div/div_final (must be > 0)");
  return combined_cos(o.pct_start(), lr_max / o.div(), lr_max, lr_max / o.div_final());
}

Schedule one_cycle_mom(const OneCycleOptions& o) {
  TORCH_CHECK(o.moms().size() == 3, "OneCycleOptions::moms needs 3 values (start, middle, end)");
  return combined_cos(o.pct_start(), o.moms()[0], o.moms()[1], o.moms()[2]);
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

double get_lr(const torch::optim::Optimizer& opt) {
  TORCH_CHECK(!opt.param_groups().empty(), "optimizer has no param groups");
  return opt.param_groups().back().options().get_lr();
}


double get_mom(const torch::optim::Optimizer& opt) {
  if (opt.param_groups().empty()) return std::numeric_limits<double>::quiet_NaN();
  // Read only: the options are not changed through the pointer.
  const double* mom = momentum_of(const_cast<torch::optim::OptimizerOptions&>(opt.param_groups().back().options()));
  return mom ? *mom : std::numeric_limits<double>::quiet_NaN();
}

bool set_mom(torch::optim::Optimizer& opt, double mom) {
  bool any = false;
  for (auto& group : opt.param_groups())
    if (double* slot = momentum_of(group.options())) *slot = mom, any = true;
  return any;
}

namespace {
std::map<std::string, std::vector<Schedule>> one_for_all_groups(const std::map<std::string, Schedule>& scheds) {
  std::map<std::string, std::vector<Schedule>> out;
  for (const auto& kv : scheds) out[kv.first] = {kv.second};
  return out;
}
} // namespace

ParamScheduler::ParamScheduler(const std::map<std::string, Schedule>& scheds)
    : ParamScheduler(one_for_all_groups(scheds)) {}

ParamScheduler::ParamScheduler(std::map<std::string, std::vector<Schedule>> scheds) : scheds_(std::move(scheds)) {
  for (const auto& kv : scheds_) {
    TORCH_CHECK(kv.first == "lr" || kv.first == "mom", "ParamScheduler: unknown hyper-parameter '", kv.first,
                "' (known: lr, mom)");
    TORCH_CHECK(!kv.second.empty(), "ParamScheduler: no schedule for '", kv.first, "'");
    TORCH_CHECK(kv.first == "lr" || kv.second.size() == 1, "ParamScheduler: only lr takes one schedule per group");
  }
}

void ParamScheduler::before_batch(Learner& learn) {
  if (!learn.training()) return;
  const double pos = learn.pct_train();
  for (const auto& kv : scheds_) {
    if (kv.first == "lr") {
      if (kv.second.size() == 1) {
        set_lr(learn.opt(), kv.second[0](pos));
      } else {
        std::vector<double> lrs;
        for (const auto& sched : kv.second) lrs.push_back(sched(pos));
        learn.set_lrs(lrs);  // throws when the schedules do not match the groups
      }
    } else if (!set_mom(learn.opt(), kv.second[0](pos))) {
      TORCH_WARN_ONCE("ParamScheduler: the optimizer has no momentum; the momentum schedule is ignored");
    }
  }
}

} // namespace mixtrain
