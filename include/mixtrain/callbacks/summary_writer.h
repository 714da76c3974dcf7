#pragma once
/// summary.json: the outcome of a fit in one machine-readable file.

#include "mixtrain/core/callback.h"

#include <torch/arg.h>

#include <cstdint>

#include <map>
#include <vector>
#include <string>

namespace mixtrain::callbacks {

using TextFields = std::map<std::string, std::string>;
using IntegerFields = std::map<std::string, int64_t>;
using NumberFields = std::map<std::string, double>;

/// SummaryWriter's options: where, and the caller's own fields.
struct SummaryWriterOptions {
  explicit SummaryWriterOptions(std::string path) : path_(std::move(path)) {}
  /// The file written (replaced) after every fit.
  TORCH_ARG(std::string, path);
  /// Extra text fields (e.g. model name).
  TORCH_ARG(TextFields, text);
  /// Extra integer fields, written as JSON integers (threads, seed, batch size).
  TORCH_ARG(IntegerFields, integers);
  /// Extra real-number fields (lr); non-finite values are written as null.
  TORCH_ARG(NumberFields, numbers);
};

/// Writes a JSON summary to `path` after fit:
///   epochs, train_loss, valid_loss, valid_<metric> for every metric, seconds,
///   samples_per_second (training samples / training time), torch_version,
///   skipped_steps, final_scale and min_scale_seen (null without loss scaling),
///   precision (its name) and emulated (from the precision callback), and with
///   master weights param_bytes_model, param_bytes_master and param_bytes_grads;
///   host_reads_per_step (device-to-host transfers per training step through
///   mixtrain/host_read.h, which every read of the step goes through);
/// plus the caller's own fields.
class SummaryWriter : public Callback {
 public:
  explicit SummaryWriter(SummaryWriterOptions options);
  std::string name() const override { return "SummaryWriter"; }
  void before_fit(Learner& learn) override;
  void before_batch(Learner& learn) override;
  void after_batch(Learner& learn) override;
  void after_fit(Learner& learn) override;
  /// The last summary written, as JSON text (what the file holds).
  const std::string& json() const { return json_; }
  /// Adds fields to the summary written by the last fit and writes it again
  /// (what is known only after the fit: the metrics of the weights handed back).
  void add(const TextFields& text, const NumberFields& numbers);

 private:
  void write(std::string json);

  SummaryWriterOptions options_;
  std::string json_;
  int64_t reads_at_batch_start_ = 0;  // host_reads() when the training batch began
  int64_t step_reads_ = 0, steps_ = 0;
};

} // namespace mixtrain::callbacks
