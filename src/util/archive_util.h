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
