#include "run/run_record.h"

#include "mixtrain/core/learner.h"
#include "mixtrain/run/options.h"
#include "mixtrain/util/option_error.h"

#include "util/read_file.h"

#include <torch/serialize.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <vector>
#include <filesystem>

namespace mixtrain::run {

std::map<std::string, std::string> input_fingerprints(const RunConfig& r) {
  std::map<std::string, std::string> out;
  namespace fs = std::filesystem;
  for (const auto& [key, path] : {std::pair<std::string, std::string>{"data", r.data}, {"model", r.model}}) {
    std::error_code ec;
    // A file, or a folder's files (a Fashion-MNIST folder: its names and bytes, in name
    // order); a built-in model or data set has none.
    std::vector<fs::path> files;
    if (path.empty()) continue;
    if (fs::is_regular_file(path, ec)) {
      files.push_back(path);
    } else if (fs::is_directory(path, ec)) {
      for (const auto& e : fs::directory_iterator(path, ec))
        if (e.is_regular_file(ec)) files.push_back(e.path());
      std::sort(files.begin(), files.end());
    }
    if (files.empty()) continue;
    uLong crc = crc32(0L, Z_NULL, 0);
    size_t bytes = 0;
    for (const auto& file : files) {
      if (files.size() > 1 || file != fs::path(path)) {
        const std::string name = file.filename().string();
        crc = crc32(crc, reinterpret_cast<const Bytef*>(name.data()), static_cast<uInt>(name.size()));
      }
      mixtrain::detail::read_file_chunks(file.string(), key + " file ", [&](const char* chunk, size_t n) {
        crc = crc32(crc, reinterpret_cast<const Bytef*>(chunk), static_cast<uInt>(n));
        bytes += n;
      });
    }
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08lx", static_cast<unsigned long>(crc));
    out[key] = (fs::is_directory(path, ec) ? std::to_string(files.size()) + " files, " : std::string()) +
               std::to_string(bytes) + " bytes, crc32 " + hex;
  }
  return out;
}

void RunRecord::save_state(torch::serialize::OutputArchive& ar) const {
  ar.write("args", c10::IValue(json_));
  c10::Dict<std::string, std::string> inputs;
  for (const auto& [key, fingerprint] : inputs_) inputs.insert(key, fingerprint);
  ar.write("inputs", c10::IValue(inputs));
}

namespace {
std::optional<Recorded> record_in(torch::serialize::InputArchive& ar, const std::string& checkpoint) {
  torch::serialize::InputArchive record;
  if (!ar.try_read(std::string("callback.") + RunRecord::kKey, record)) return std::nullopt;
  c10::IValue json, inputs;
  TORCH_CHECK(record.try_read("args", json) && json.isString(), "Checkpoint ", checkpoint, " has a damaged run record");
  Recorded out;
  try {
    out.config = RunConfig::from_json(json.toStringRef());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "Checkpoint ", checkpoint, " has a damaged run record (", e.msg(), ")");
  }
  if (record.try_read("inputs", inputs)) {
    TORCH_CHECK(inputs.isGenericDict(), "Checkpoint ", checkpoint, " has a damaged run record");
    for (const auto& kv : inputs.toGenericDict()) {
      TORCH_CHECK(kv.key().isString() && kv.value().isString(), "Checkpoint ", checkpoint, " has a damaged run record");
      out.inputs[kv.key().toStringRef()] = kv.value().toStringRef();
    }
  }
  return out;
}
} // namespace

std::optional<Recorded> recorded_run(const std::string& path) {
  torch::serialize::InputArchive ar;
  Learner::open_checkpoint(path, ar);
  return record_in(ar, path);
}

std::optional<Recorded> recorded_run(const std::string& bytes, const std::string& name) {
  torch::serialize::InputArchive ar;
  Learner::open_checkpoint(bytes.data(), bytes.size(), name, ar);
  return record_in(ar, name);
}

void check_same_run(const RunConfig& trained, const RunConfig& now, const SameRunWords& words) {
  RunArgs was, is;
  was.config = trained;
  is.config = now;
  for (const Option& o : options()) {
    if (!o.stored || o.key == "threads") continue;
    const std::string before = o.get(was), after = o.get(is);
    if (before == after) continue;
    // A switch is on or off, an empty list is none (not "drop --x", not "--x " with nothing after it).
    const auto value = [&](const std::string& v) {
      if (o.type == ValueType::kSwitch) return Phrase::name(o.key) + (v == "true" ? " on" : " off");
      if (v.empty()) return Phrase::name(o.key) + " none";
      return Phrase::setting(o.key, v);
    };
    throw OptionError(o.key, words.cannot + ": args.json sets " + value(after) + " but " + words.trained_by +
                                 " trained with " + value(before) + "; " + words.continues + " (put args.json back" +
                                 words.instead + ")");
  }
}

void check_same_inputs(const std::map<std::string, std::string>& trained, const std::map<std::string, std::string>& current,
                       const RunConfig& now, const SameRunWords& words) {
  for (const auto& [key, fingerprint] : trained) {
    const auto it = current.find(key);
    const std::string path = key == "data" ? now.data : now.model;
    if (it != current.end() && it->second == fingerprint) continue;
    throw OptionError(key, words.cannot + ": " + Phrase::name(key) + " " + path +
                               (it == current.end() ? " is no longer there" : " is " + it->second) + ", but " +
                               words.trained_by + " trained on " + fingerprint + "; " + words.continues +
                               " on the same file (put it back" + words.instead + ")");
  }
}

} // namespace mixtrain::run
