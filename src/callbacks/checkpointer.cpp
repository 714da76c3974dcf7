#include "mixtrain/callbacks/checkpointer.h"

#include "mixtrain/util/atomic_file.h"
#include "mixtrain/core/learner.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <regex>
#include <vector>

namespace fs = std::filesystem;

namespace mixtrain::callbacks {

Checkpointer::Checkpointer(CheckpointerOptions options) : options_(std::move(options)) {
  TORCH_CHECK(options_.every() >= 0, "Invalid checkpoint interval: ", options_.every(), " (must be >= 0)");
  TORCH_CHECK(options_.every_steps() >= 0, "Invalid checkpoint step interval: ", options_.every_steps(), " (must be >= 0)");
  TORCH_CHECK(options_.keep() >= 0, "Invalid number of checkpoints to keep: ", options_.keep(), " (must be >= 0)");
  order = 90;
}

namespace {

const std::regex& checkpoint_name() {
  static const std::regex pattern(R"(checkpoint-(\d{1,18})\.pt)");
  return pattern;
}

/// The complete checkpoints of `dir`, newest (highest step) first.
std::vector<std::pair<int64_t, fs::path>> checkpoints_in(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (!std::regex_match(file, m, checkpoint_name()) || !entry.is_regular_file(ec)) continue;
    found.emplace_back(std::stoll(m[1]), entry.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

} // namespace

bool Checkpointer::holds_checkpoints(const std::string& dir) { return !checkpoints_in(dir).empty(); }

std::vector<std::string> Checkpointer::newest_first(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& [step, path] : checkpoints_in(dir)) out.push_back(dir + "/" + path.filename().string());
  return out;
}

std::string Checkpointer::latest(const std::string& dir) {
  const auto found = checkpoints_in(dir);
  return found.empty() ? "" : dir + "/" + found.front().second.filename().string();
}

int Checkpointer::remove_dead_temp_files(const std::string& dir) {
  static const std::regex temp(R"(.+\.tmp\.(\d{1,9}))");  // write_file_atomically's NAME.tmp.PID
  int removed = 0;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (!std::regex_match(file, m, temp) || !entry.is_regular_file(ec)) continue;
    const auto pid = static_cast<pid_t>(std::stol(m[1]));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its writer may still be at work
    if (fs::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

std::string Checkpointer::save(Learner& learn) {
  if (!options_.write()) return "";
  const std::string name = "checkpoint-" + std::to_string(learn.train_iter()) + ".pt";
  learn.save(options_.dir() + "/" + name);
  write_file_atomically(options_.dir() + "/latest", name + "\n");
  last_path_ = options_.dir() + "/" + name;
  if (options_.keep() == 0) return last_path_;
  // Keep the newest `keep` by step number; the one just written is always among them.
  const auto found = checkpoints_in(options_.dir());
  std::error_code ec;
  for (size_t i = static_cast<size_t>(options_.keep()); i < found.size(); ++i) fs::remove(found[i].second, ec);
  return last_path_;
}

void Checkpointer::after_batch(Learner& learn) {
  if (!learn.training()) return;
  if (options_.armed()) options_.armed()->store(true);
  const bool stop = options_.stop() && options_.stop()->load();
  if (!stop) {
    if (options_.every_steps() > 0 && learn.train_iter() % options_.every_steps() == 0) save(learn);
    return;
  }
  save(learn);
  interrupted_ = true;
  throw CancelFitException();
}

void Checkpointer::after_epoch(Learner& learn) {
  const bool last = learn.epoch() + 1 == learn.n_epoch();
  // A step checkpoint of the epoch's last batch is replaced by this one, which holds the validation too.
  if (options_.every() > 0 && ((learn.epoch() + 1) % options_.every() == 0 || last)) save(learn);
}

} // namespace mixtrain::callbacks
