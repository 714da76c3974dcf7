#pragma once
/// summary.json: the outcome of a fit in one machine-readable file.

#include "mixtrain/callback.h"

#include <map>
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
  void after_fit(Learner& learn) override;

 private:
  std::string path_;
  std::map<std::string, std::string> text_fields_;
  std::map<std::string, double> number_fields_;
  std::map<std::string, bool> flag_fields_;
};

} // namespace mixtrain::callbacks
