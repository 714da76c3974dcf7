#pragma once
// Private helpers for checkpoint archives: scalars, strings and vectors as
// archive entries, with errors that name the missing entry.

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace mixtrain::detail {

inline void write_f64(torch::serialize::OutputArchive& ar, const std::string& key, double v) {
  ar.write(key, torch::tensor(v, torch::kDouble));
}
inline void write_i64(torch::serialize::OutputArchive& ar, const std::string& key, int64_t v) {
  ar.write(key, torch::tensor(v, torch::kLong));
}
inline void write_f64s(torch::serialize::OutputArchive& ar, const std::string& key, const std::vector<double>& v) {
  ar.write(key, torch::tensor(v, torch::kDouble));
}

inline torch::Tensor read_tensor(torch::serialize::InputArchive& ar, const std::string& key) {
  torch::Tensor t;
  TORCH_CHECK(ar.try_read(key, t), "checkpoint has no entry '", key, "'");
  return t;
}
inline double read_f64(torch::serialize::InputArchive& ar, const std::string& key) {
  return read_tensor(ar, key).item<double>();
}
inline int64_t read_i64(torch::serialize::InputArchive& ar, const std::string& key) {
  return read_tensor(ar, key).item<int64_t>();
}
inline std::vector<double> read_f64s(torch::serialize::InputArchive& ar, const std::string& key) {
  torch::Tensor t = read_tensor(ar, key).to(torch::kDouble).contiguous();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

} // namespace mixtrain::detail

#include "mixtrain/amp/scale_history.h"

namespace mixtrain::detail {

inline void write_history(torch::serialize::OutputArchive& ar, const amp::ScaleHistory& h) {
  write_f64s(ar, "history.scales", h.scales);
  std::vector<double> skipped(h.skipped.begin(), h.skipped.end());
  write_f64s(ar, "history.skipped", skipped);
}

inline amp::ScaleHistory read_history(torch::serialize::InputArchive& ar) {
  amp::ScaleHistory h;
  h.scales = read_f64s(ar, "history.scales");
  for (double s : read_f64s(ar, "history.skipped")) h.skipped.push_back(s != 0);
  TORCH_CHECK(h.scales.size() == h.skipped.size(), "checkpoint's scale history is inconsistent");
  return h;
}

} // namespace mixtrain::detail
