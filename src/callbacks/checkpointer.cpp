#include "mixtrain/callbacks/checkpointer.h"

#include "mixtrain/atomic_file.h"
#include "mixtrain/learner.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <vector>

namespace fs = std::filesystem;

namespace mixtrain::callbacks {

Checkpointer::Checkpointer(std::string dir, int64_t every, int64_t keep, const std::atomic<bool>* stop, bool write)
    : dir_(std::move(dir)), every_(every), keep_(keep), stop_(stop), write_(write) {
  TORCH_CHECK(every >= 0, "Invalid checkpoint interval: ", every, " (must be >= 0)");
  TORCH_CHECK(keep >= 0, "Invalid number of checkpoints to keep: ", keep, " (must be >= 0)");
  order = 90;
}

std::string Checkpointer::latest(const std::string& dir) {
  std::ifstream f(dir + "/latest");
  std::string name;
  if (!f || !std::getline(f, name) || name.empty()) return "";
  return dir + "/" + name;
}

std::string Checkpointer::save(Learner& learn) {
  if (!write_) return "";
  const std::string name = "checkpoint-" + std::to_string(learn.train_iter()) + ".pt";
  learn.save(dir_ + "/" + name);
  write_file_atomically(dir_ + "/latest", name + "\n");
  last_path_ = dir_ + "/" + name;
  if (keep_ == 0) return last_path_;
  // Keep the newest `keep_` by step number; the one just written is always among them.
  static const std::regex pattern(R"(checkpoint-(\d+)\.pt)");
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, pattern)) found.emplace_back(std::stoll(m[1]), entry.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep_); i < found.size(); ++i) fs::remove(found[i].second);
  return last_path_;
}

void Checkpointer::after_batch(Learner& learn) {
  if (!learn.training() || !stop_ || !stop_->load()) return;
  save(learn);
  interrupted_ = true;
  throw CancelFitException();
}

void Checkpointer::after_epoch(Learner& learn) {
  const bool last = learn.epoch() + 1 == learn.n_epoch();
  if (every_ > 0 && ((learn.epoch() + 1) % every_ == 0 || last)) save(learn);
}

} // namespace mixtrain::callbacks
