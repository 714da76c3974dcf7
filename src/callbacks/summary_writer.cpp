#include "mixtrain/callbacks/summary_writer.h"

#include "mixtrain/core/precision_callback.h"
#include "mixtrain/util/host_read.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/core/precision.h"

#include "util/json_number.h"

#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

namespace mixtrain::callbacks {

using detail::json_number;

SummaryWriter::SummaryWriter(SummaryWriterOptions options) : options_(std::move(options)) { order = 80; }

void SummaryWriter::before_fit(Learner&) { step_reads_ = steps_ = 0; }

void SummaryWriter::before_batch(Learner&) { reads_at_batch_start_ = host_reads(); }

void SummaryWriter::after_batch(Learner& learn) {
  if (!learn.training()) return;
  step_reads_ += host_reads() - reads_at_batch_start_;
  ++steps_;
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
  j["host_reads_per_step"] = json_number(steps_ > 0 ? static_cast<double>(step_reads_) / static_cast<double>(steps_) : NAN);
  // Loss-scale outcome: how many steps were skipped, where the scale ended and its low point.
  // A branch (train --from) counts its own steps: the parent's are the parent's summary.
  double final_scale = NAN, min_scale = NAN;
  for (size_t i = static_cast<size_t>(rec.branch_step()); i < rec.steps().size(); ++i) {
    const StepRecord& s = rec.steps()[i];
    if (!std::isfinite(s.scale)) continue;
    final_scale = s.scale;
    min_scale = std::isfinite(min_scale) ? std::min(min_scale, s.scale) : s.scale;
  }
  j["skipped_steps"] = rec.own_skipped_steps();
  if (rec.branch_step() > 0) {
    j["branched_at_step"] = rec.branch_step();
    j["parent_skipped_steps"] = rec.skipped_steps() - rec.own_skipped_steps();
  }
  j["final_scale"] = json_number(final_scale);
  j["min_scale_seen"] = json_number(min_scale);
  j["seconds"] = seconds;
  j["samples_per_second"] = json_number(train_seconds > 0 ? samples / train_seconds : NAN);
  j["torch_version"] = TORCH_VERSION;
  // The precision as the callback ran it (emulated is decided at fit start, by the device).
  const auto pc = learn.precision_cb();
  j["precision"] = precision_name(learn.precision());
  j["emulated"] = pc && pc->emulated();
  if (const auto mem = pc ? pc->param_memory() : std::nullopt) {
    j["param_bytes_model"] = mem->model;
    j["param_bytes_master"] = mem->masters;
    j["param_bytes_grads"] = mem->grads;
    if (pc->pure_weights()) {
      // What each parameter costs as the mode lays it out (bf16-pure: 2 + 2 + the optimizer's states).
      int64_t params = 0;
      for (const auto& p : learn.model().module().parameters()) params += p.numel();
      const double n = static_cast<double>(std::max<int64_t>(1, params));
      j["bytes_per_param"] = {{"weights", mem->model / n},
                              {"grads", mem->grads / n},
                              {"optimizer_state", mem->optimizer_state / n},
                              {"compensation", mem->compensation / n}};
    }
  }
  if (const auto lost = pc ? pc->lost_updates() : std::nullopt) {
    nlohmann::json worst = nlohmann::json::array();
    for (const auto& p : lost->worst)
      worst.push_back({{"name", p.name}, {"numel", p.numel}, {"fraction", p.fraction}, {"never_moved", p.never_moved},
                       {"mean_abs_weight", json_number(p.mean_abs_weight)}, {"rms_update", json_number(p.rms_update)}});
    j["lost_updates"] = {{"weight_update", lost->rule},   {"intended", lost->intended},
                         {"lost", lost->lost},            {"fraction", lost->fraction},
                         {"norm_ratio", lost->norm_ratio}, {"per_epoch", lost->fraction_per_epoch},
                         {"worst", worst},                {"means", lost_updates_meaning(lost->rule)},
                         {"islands", lost->islands},      {"island_params", lost->island_params},
                         {"island_extra_bytes", lost->island_extra_bytes}};
  }
  for (const auto& kv : options_.text()) j[kv.first] = kv.second;
  for (const auto& kv : options_.integers()) j[kv.first] = kv.second;
  for (const auto& kv : options_.numbers()) j[kv.first] = json_number(kv.second);
  write(j.dump(2) + "\n");
}

void SummaryWriter::add(const TextFields& text, const NumberFields& numbers) {
  TORCH_CHECK(!json_.empty(), "SummaryWriter::add: no summary written yet (it is written after a fit)");
  nlohmann::json j = nlohmann::json::parse(json_);
  for (const auto& kv : text) j[kv.first] = kv.second;
  for (const auto& kv : numbers) j[kv.first] = json_number(kv.second);
  write(j.dump(2) + "\n");
}

void SummaryWriter::write(std::string json) {
  const std::string& path = options_.path();
  std::ofstream f(path, std::ios::out | std::ios::trunc);
  TORCH_CHECK(f.is_open(), "Cannot write ", path, ": ", std::strerror(errno));
  json_ = std::move(json);
  f << json_;
  TORCH_CHECK(f.good(), "Writing ", path, " failed");
}

} // namespace mixtrain::callbacks
