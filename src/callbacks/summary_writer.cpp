#include "mixtrain/callbacks/summary_writer.h"

#include "mixtrain/learner.h"

#include "../json_number.h"

#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <cmath>
#include <cstring>
#include <fstream>

namespace mixtrain::callbacks {

namespace {
using detail::json_number;
/// Counts (threads, seed, batch size) read better as JSON integers.
nlohmann::json number_or_integer(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < 9e15) return nlohmann::json(static_cast<int64_t>(v));
  return json_number(v);
}
} // namespace

SummaryWriter::SummaryWriter(std::string path, std::map<std::string, std::string> text_fields,
                             std::map<std::string, double> number_fields, std::map<std::string, bool> flag_fields)
    : path_(std::move(path)), text_fields_(std::move(text_fields)), number_fields_(std::move(number_fields)),
      flag_fields_(std::move(flag_fields)) {
  order = 80;
}

void SummaryWriter::after_fit(Learner& learn) {
  const Recorder& rec = learn.recorder();
  nlohmann::json j;
  double seconds = 0, train_seconds = 0;
  int64_t samples = 0;
  for (const auto& e : rec.values()) {
    seconds += e.seconds;
    train_seconds += e.train_seconds;
    samples += e.samples;
  }
  j["epochs"] = rec.values().size();
  if (!rec.values().empty()) {
    const EpochRecord& last = rec.values().back();
    j["train_loss"] = json_number(last.train_loss);
    j["valid_loss"] = json_number(last.valid_loss);
    const auto names = rec.metric_names();
    for (size_t i = 0; i < names.size() && i < last.metrics.size(); ++i) j["valid_" + names[i]] = json_number(last.metrics[i]);
  }
  j["steps"] = rec.steps().size();
  // Loss-scale outcome: how many steps were skipped, where the scale ended and its low point.
  double final_scale = NAN, min_scale = NAN;
  for (const auto& s : rec.steps()) {
    if (!std::isfinite(s.scale)) continue;
    final_scale = s.scale;
    min_scale = std::isfinite(min_scale) ? std::min(min_scale, s.scale) : s.scale;
  }
  j["skipped_steps"] = rec.skipped_steps();
  j["final_scale"] = json_number(final_scale);
  j["min_scale_seen"] = json_number(min_scale);
  j["seconds"] = seconds;
  j["samples_per_second"] = json_number(train_seconds > 0 ? samples / train_seconds : NAN);
  j["torch_version"] = TORCH_VERSION;
  for (const auto& kv : text_fields_) j[kv.first] = kv.second;
  for (const auto& kv : number_fields_) j[kv.first] = number_or_integer(kv.second);
  for (const auto& kv : flag_fields_) j[kv.first] = kv.second;
  for (const auto& provider : late_numbers_)
    for (const auto& kv : provider()) j[kv.first] = number_or_integer(kv.second);
  std::ofstream f(path_, std::ios::out | std::ios::trunc);
  TORCH_CHECK(f.is_open(), "Cannot write ", path_, ": ", std::strerror(errno));
  f << j.dump(2) << '\n';
  TORCH_CHECK(f.good(), "Writing ", path_, " failed");
}

} // namespace mixtrain::callbacks
