// Tensor files as data: the dict a Python user writes with torch.save.
#include "mixtrain/data/data.h"

#include "util/bounded_reader.h"
#include "util/first_line.h"
#include "util/pickle_check.h"
#include "util/read_file.h"
#include "util/tensor_bounds.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <unistd.h>
#include <cstring>
#include <unordered_map>

#include <iostream>
#include <string>
#include <vector>

namespace mixtrain::data {

namespace {

/// What a Python user would call the value's type.
std::string kind_of(const c10::IValue& v) {
  if (v.isList()) return "list";
  if (v.isTuple()) return "tuple";
  if (v.isGenericDict()) return "dict";
  if (v.isInt()) return "int";
  if (v.isDouble()) return "float";
  if (v.isBool()) return "bool";
  if (v.isString()) return "str";
  if (v.isNone()) return "None";
  return v.tagKind();
}

/// The tensor behind `key` as the models read it: detached, contiguous, float64 as
/// float32, small integers as int64 (targets: every integer type).
torch::Tensor as_data(const c10::IValue& v, const std::string& what, const std::string& path, bool is_target) {
  TORCH_CHECK(v.isTensor(), path, ": '", what, "' is a ", kind_of(v), ", not a tensor");
  torch::Tensor t = v.toTensor().detach();
  TORCH_CHECK(t.dim() > 0, path, ": '", what, "' is a 0-dim tensor; it needs one row per sample");
  if (t.scalar_type() == at::kDouble) t = t.to(at::kFloat);
  if (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16) {
    // As a mixed-precision pipeline often saves it: the models read fp32, and the
    // precision mode decides what computes in half.
    std::cerr << "mixtrain: notice: " << path << ": '" << what << "' is stored in " << t.scalar_type()
              << "; it is read as fp32" << std::endl;
    t = t.to(at::kFloat);
  }
  // Class targets and token ids are int64 to libtorch (cross_entropy, embedding): int32
  // and the other small integers are widened, exactly. uint8 inputs stay (images: the
  // model's first layer says what it needs, and the probe's error says what to do).
  const bool small_int = at::isIntegralType(t.scalar_type(), /*includeBool=*/false) && t.scalar_type() != at::kLong;
  if (small_int && (is_target || t.scalar_type() != at::kByte)) t = t.to(at::kLong);
  // A stride-0 (expanded) tensor fits any storage; made contiguous it needs all of its
  // elements (2^31 rows claimed 171 GB): more than this machine holds is said as such.
  if (!t.is_contiguous()) {
    const double bytes = static_cast<double>(t.numel()) * static_cast<double>(t.element_size());
    const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
    TORCH_CHECK(memory <= 0 || bytes <= memory, path, ": '", what, "' of shape ", t.sizes(), " is a view (strides ",
                t.strides(), ") that needs ", bytes / 1e9, " GB as data, more than this machine's ", memory / 1e9,
                " GB of memory");
  }
  return t.contiguous();
}

/// torch::jit::pickle_load, keeping the size of the buffer each storage record was
/// read into: libtorch sizes a storage by the element count the pickle claims, so a
/// file could claim more than its record holds (the fuzzer found one), and the
/// storage check needs the real size.
c10::IValue unpickle(const std::string& bytes, std::unordered_map<const void*, size_t>& buffer_sizes) {
  caffe2::serialize::PyTorchStreamReader archive(std::make_unique<detail::BoundedReader>(bytes));
  at::DataPtr pickle;
  size_t pickle_size = 0;
  std::tie(pickle, pickle_size) = archive.getRecord("data.pkl");
  size_t done = 0;
  const auto* text = static_cast<const char*>(pickle.get());
  detail::check_pickle(text, pickle_size);
  auto read = [&](char* out, size_t n) {
    n = std::min(n, pickle_size - done);
    if (n) std::memcpy(out, text + done, n);
    done += n;
    return n;
  };
  auto read_record = [&](const std::string& name) {
    at::DataPtr data;
    size_t size = 0;
    std::tie(data, size) = archive.getRecord("data/" + name);
    buffer_sizes[data.get()] = size;
    return data;
  };
  torch::jit::Unpickler unpickler(read, nullptr, nullptr, read_record, c10::nullopt);
  unpickler.set_version(archive.version());
  return unpickler.parse_ivalue();
}

/// x: one tensor, or a list/tuple of tensors (the model's inputs in order).
std::vector<c10::IValue> inputs_of(const c10::IValue& v, const std::string& key, const std::string& path) {
  if (v.isTensor()) return {v};
  if (v.isList() || v.isTuple()) return v.isList() ? v.toListRef().vec() : v.toTupleRef().elements().vec();
  TORCH_CHECK(false, path, ": '", key, "' is a ", kind_of(v), ", not a tensor or a list of tensors");
}

/// x's inputs and y as one Dataset, checked to hold as many samples each.
Dataset dataset_of(const std::vector<c10::IValue>& x, const c10::IValue& y, const std::string& xkey,
                   const std::string& ykey, const std::string& path) {
  TORCH_CHECK(!x.empty(), path, ": '", xkey, "' is an empty list; it needs one tensor per model input");
  std::vector<torch::Tensor> in;
  for (size_t i = 0; i < x.size(); ++i)
    in.push_back(as_data(x[i], x.size() > 1 ? xkey + "[" + std::to_string(i) + "]" : xkey, path, false));
  Dataset d{in[0], as_data(y, ykey, path, true), {in.begin() + 1, in.end()}};
  for (size_t i = 0; i < in.size(); ++i)
    TORCH_CHECK(in[i].size(0) == d.y.size(0), path, ": ", xkey, in.size() > 1 ? "[" + std::to_string(i) + "]" : "",
                " has ", in[i].size(0), " samples but ", ykey, " has ", d.y.size(0));
  return d;
}

Dataset take(const Dataset& d, const torch::Tensor& idx) {
  Dataset out{d.x.index_select(0, idx), d.y.index_select(0, idx)};
  for (const auto& e : d.extra_x) out.extra_x.push_back(e.index_select(0, idx));
  return out;
}

/// The train and valid sets: valid_x given, or a seeded kTensorFileValidFraction of x.
DatasetSplit split_of(const std::vector<c10::IValue>& x, const c10::IValue& y, const std::vector<c10::IValue>& valid_x,
                      const c10::IValue& valid_y, uint64_t seed, const std::string& path, const std::string& valid_hint) {
  DatasetSplit split;
  const Dataset all = dataset_of(x, y, "x", "y", path);
  if (!valid_x.empty()) {
    split.train = all;
    split.valid = dataset_of(valid_x, valid_y, "valid_x", "valid_y", path);
    TORCH_CHECK(split.valid.extra_x.size() == all.extra_x.size(), path, ": 'x' holds ", all.extra_x.size() + 1,
                " inputs but 'valid_x' holds ", split.valid.extra_x.size() + 1);
  } else {
    const int64_t n = all.size();
    const auto n_valid = static_cast<int64_t>(static_cast<double>(n) * kTensorFileValidFraction);
    TORCH_CHECK(n_valid > 0 && n_valid < n, path, " has ", n, n == 1 ? " sample" : " samples", ": too few to keep ",
                kTensorFileValidFraction * 100, "% for validation; ", valid_hint);
    at::Generator gen = at::detail::createCPUGenerator(seed);
    const torch::Tensor order = at::randperm(n, gen, at::kLong);
    split.train = take(all, order.slice(0, n_valid));
    split.valid = take(all, order.slice(0, 0, n_valid));
  }
  return split;
}

} // namespace

DatasetSplit load_tensor_file(const std::string& path, uint64_t seed) {
  return parse_tensor_file(detail::read_whole_file(path, "data file "), path, seed);
}

DatasetSplit parse_tensor_file(const std::string& bytes, const std::string& path, uint64_t seed) {
  c10::IValue loaded;
  std::unordered_map<const void*, size_t> buffer_sizes;
  try {
    loaded = unpickle(bytes, buffer_sizes);
  } catch (const c10::Error& e) {
    // libtorch's unpickler lacks some opcodes Python writes (a dict with one key uses SETITEM).
    const std::string why = detail::first_line(e.what());
    const std::string past_storage = detail::storage_bounds_message(why);
    TORCH_CHECK(past_storage.empty(), path, " is damaged: ", past_storage);
    TORCH_CHECK(why.find("Unknown opcode") == std::string::npos, path,
                " cannot be read (", why, "); it needs a dict with 'x' and 'y' written by torch.save");
    TORCH_CHECK(false, path, " is not a file written by torch.save (", why, ")");
  } catch (const std::exception& e) {
    // The unpickler throws more than c10::Error on damaged input (std::out_of_range, for one).
    TORCH_CHECK(false, path, " is not a file written by torch.save, or is damaged (", detail::first_line(e.what()), ")");
  }
  // Before anything reads a tensor: each must fit the storage the file holds.
  detail::check_tensors_in_storage(loaded, path, "", &buffer_sizes);
  TORCH_CHECK(loaded.isGenericDict(), path, " holds a ", kind_of(loaded),
              ", not a dict with keys 'x', 'y' (and optionally 'valid_x', 'valid_y')");
  const auto dict = loaded.toGenericDict();
  for (const auto& kv : dict)
    TORCH_CHECK(kv.key().isString(), path, ": the dict's keys must be strings ('x', 'y', 'valid_x', 'valid_y')");
  for (const char* key : {"x", "y"})
    TORCH_CHECK(dict.contains(key), path, " has no '", key, "' (it needs 'x' and 'y'; 'valid_x', 'valid_y' optional)");
  TORCH_CHECK(dict.contains("valid_x") == dict.contains("valid_y"), path, " has ",
              dict.contains("valid_x") ? "'valid_x' without 'valid_y'" : "'valid_y' without 'valid_x'");

  std::vector<c10::IValue> valid_x;
  if (dict.contains("valid_x")) {
    valid_x = inputs_of(dict.at("valid_x"), "valid_x", path);
    TORCH_CHECK(!valid_x.empty(), path, ": 'valid_x' is an empty list; it needs one tensor per model input");
  }
  return split_of(inputs_of(dict.at("x"), "x", path), dict.at("y"), valid_x,
                  dict.contains("valid_y") ? dict.at("valid_y") : c10::IValue(), seed, path, "add 'valid_x' and 'valid_y'");
}

DatasetSplit tensor_split(const std::vector<torch::Tensor>& x, const torch::Tensor& y,
                          const std::vector<torch::Tensor>& valid_x, const torch::Tensor& valid_y, uint64_t seed,
                          const std::string& source, const std::string& valid_hint) {
  const auto values = [](const std::vector<torch::Tensor>& ts) { return std::vector<c10::IValue>(ts.begin(), ts.end()); };
  TORCH_CHECK(!x.empty(), source, ": x holds no tensor; it needs one tensor per model input");
  TORCH_CHECK(y.defined(), source, ": y is missing");
  TORCH_CHECK(valid_x.empty() == !valid_y.defined(), source, ": ", valid_x.empty() ? "valid y without valid x" : "valid x without valid y");
  return split_of(values(x), y, values(valid_x), valid_y.defined() ? c10::IValue(valid_y) : c10::IValue(), seed, source,
                  valid_hint);
}

} // namespace mixtrain::data
