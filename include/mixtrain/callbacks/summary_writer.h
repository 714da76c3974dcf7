#pragma once
/// summary.json: the outcome of a fit in one machine-readable file.

#include "mixtrain/callback.h"

#include <functional>
#include <map>
#include <vector>
#include <string>

namespace mixtrain::callbacks {

/// Writes a JSON summary to `path` after fit:
///   epochs, train_loss, valid_loss, valid_<metric> for every metric, seconds,
///   samples_per_second (training samples / training time), torch_version,
///   skipped_steps, final_scale and min_scale_seen (null without loss scaling),
/// plus the caller's own fields (e.g. precision, threads).
class SummaryWriter : public Callback {
 public:
  SummaryWriter(std::string path, std::map<std::string, std::string> text_fields = {},
                std::map<std::string, double> number_fields = {}, std::map<std::string, bool> flag_fields = {});
  std::string name() const override { return "SummaryWriter"; }
  /// Numbers computed when the summary is written (after fit), e.g. memory in use then.
  void add_late_numbers(std::function<std::map<std::string, double>()> provider) {
    late_numbers_.push_back(std::move(provider));
  }
  void after_fit(Learner& learn) override;

 private:
  std::string path_;
  std::map<std::string, std::string> text_fields_;
  std::map<std::string, double> number_fields_;
  std::map<std::string, bool> flag_fields_;
  std::vector<std::function<std::map<std::string, double>()>> late_numbers_;
};

} // namespace mixtrain::callbacks
