#include "mixtrain/callbacks/checkpointer.h"

#include "mixtrain/util/atomic_file.h"
#include "mixtrain/core/learner.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <vector>

namespace fs = std::filesystem;

namespace mixtrain::callbacks {

Checkpointer::Checkpointer(CheckpointerOptions options) : options_(std::move(options)) {
  TORCH_CHECK(options_.every() >= 0, "Invalid checkpoint interval: ", options_.every(), " (must be >= 0)");
  TORCH_CHECK(options_.keep() >= 0, "Invalid number of checkpoints to keep: ", options_.keep(), " (must be >= 0)");
  order = 90;
}

bool Checkpointer::holds_checkpoints(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "latest", ec)) return true;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().rfind("checkpoint-", 0) == 0) return true;
  return false;
}

std::string Checkpointer::latest(const std::string& dir) {
  std::ifstream f(dir + "/latest");
  std::string name;
  if (!f || !std::getline(f, name) || name.empty()) return "";
  return dir + "/" + name;
}

std::string Checkpointer::save(Learner& learn) {
  if (!options_.write()) return "";
  const std::string name = "checkpoint-" + std::to_string(learn.train_iter()) + ".pt";
  learn.save(options_.dir() + "/" + name);
  write_file_atomically(options_.dir() + "/latest", name + "\n");
  last_path_ = options_.dir() + "/" + name;
  if (options_.keep() == 0) return last_path_;
  // Keep the newest `keep` by step number; the one just written is always among them.
  static const std::regex pattern(R"(checkpoint-(\d+)\.pt)");
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto& entry : fs::directory_iterator(options_.dir())) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, pattern)) found.emplace_back(std::stoll(m[1]), entry.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(options_.keep()); i < found.size(); ++i) fs::remove(found[i].second);
  return last_path_;
}

void Checkpointer::after_batch(Learner& learn) {
  if (!learn.training() || !options_.stop() || !options_.stop()->load()) return;
  save(learn);
  interrupted_ = true;
  throw CancelFitException();
}

void Checkpointer::after_epoch(Learner& learn) {
  const bool last = learn.epoch() + 1 == learn.n_epoch();
  if (options_.every() > 0 && ((learn.epoch() + 1) % options_.every() == 0 || last)) save(learn);
}

} // namespace mixtrain::callbacks
