#include "mixtrain/run/run_folder.h"

#include "mixtrain/util/atomic_file.h"
#include "mixtrain/callbacks/checkpointer.h"
#include "mixtrain/diagnose/plots.h"
#include "mixtrain/util/option_error.h"
#include "mixtrain/run/model_file.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

namespace mixtrain::run {

namespace fs = std::filesystem;

std::string RunFolder::default_path(const std::string& prefix) {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&t));
  return "runs/" + prefix + buf + "-" + std::to_string(::getpid());
}

namespace {
std::string without_trailing_separator(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}
} // namespace

std::string RunFolder::resolve(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const fs::path real = fs::weakly_canonical(path, ec);
  if (ec) return without_trailing_separator(path);
  const std::string lexical = without_trailing_separator(fs::path(path).lexically_normal().string());
  const fs::path lexical_real = fs::weakly_canonical(lexical, ec);
  if (!ec && without_trailing_separator(lexical_real.string()) == without_trailing_separator(real.string())) return lexical;
  return without_trailing_separator(real.string());
}

bool RunFolder::holds_run() const {
  std::error_code ec;
  return holds_checkpoints() || fs::exists(fs::symlink_status(file("args.json"), ec));
}

void RunFolder::refuse_run(const std::string& who) const {
  if (holds_run())
    throw OptionError("out", Phrase::name("out") + " " + path_ + " holds a run (" +
                                 (holds_checkpoints() ? "its checkpoints" : "its args.json") + "), and " + who +
                                 " would overwrite its files there: pass another folder");
}

void RunFolder::refuse_unless_forced(bool force) const {
  // A run that stopped before its first checkpoint left nothing to resume or keep: its
  // folder (args.json, the failure's traces) takes the next run, as it always did.
  if (force || !(finished() || holds_checkpoints())) return;
  const Phrase instead = ", or pass " + Phrase::setting("force", "true") + " to start over there";
  if (finished()) throw OptionError("force", Phrase::name("out") + " " + path_ + " holds a finished run; name another folder" + instead);
  throw OptionError("force", Phrase::name("out") + " " + path_ + " already holds checkpoints; continue it with " +
                                 Phrase::setting("resume", path_) + instead);
}

void RunFolder::prepare() const {
  std::error_code ec;
  fs::create_directories(path_, ec);
  if (ec || !fs::is_directory(path_))
    throw OptionError("out", "cannot create " + Phrase::name("out") + " directory " + path_ + ": " +
                                 (ec ? ec.message() : "not a directory"));
  const fs::path probe = fs::path(path_) / ".mixtrain-write-test";
  {
    std::ofstream f(probe);
    if (!f || !(f << "ok") || !f.flush()) throw OptionError("out", Phrase::name("out") + " directory " + path_ + " is not writable");
  }
  fs::remove(probe, ec);
  // The Checkpointer names each checkpoint in `latest`: found at the first checkpoint, an
  // epoch in, this would cost the epoch.
  const fs::path latest = fs::path(path_) / "latest";
  if (fs::exists(fs::symlink_status(latest, ec)) && !fs::is_regular_file(fs::symlink_status(latest, ec)))
    throw OptionError("out", Phrase::name("out") + " directory " + path_ + " holds 'latest', which is not a regular file "
                                                                            "(checkpoints are named there): remove it");
}

bool RunFolder::holds_checkpoints() const { return callbacks::Checkpointer::holds_checkpoints(path_); }

void RunFolder::clear_checkpoints() const {
  remove_dead_temp_files();
  std::error_code ec;
  for (std::string checkpoint; !(checkpoint = latest_checkpoint()).empty();)
    if (!fs::remove(checkpoint, ec)) throw OptionError("force", "cannot remove the old run's " + checkpoint + ": " + ec.message());
  fs::remove(file("latest"), ec);
}

void RunFolder::remove_dead_temp_files() const { callbacks::Checkpointer::remove_dead_temp_files(path_); }

std::string RunFolder::latest_checkpoint() const { return callbacks::Checkpointer::latest(path_); }

bool RunFolder::finished() const { return static_cast<bool>(std::ifstream(file("finished"))); }

void RunFolder::mark_finished(int64_t epochs) const {
  write_file_atomically(file("finished"), "finished after " + std::to_string(epochs) + " epoch(s)\n");
}

void RunFolder::clear_finished() const { std::remove(file("finished").c_str()); }

void RunFolder::write_model(const Model& model, const std::string& builtin_name) const {
  save_model(model, file("model.pt"), builtin_name);
}

std::map<std::string, std::string> RunFolder::write_charts(const Recorder& recorder) const {
  std::map<std::string, std::string> charts{{"loss", diagnose::plot_loss(recorder)}, {"lr", diagnose::plot_sched(recorder)}};
  if (std::string scale = diagnose::plot_scale(recorder); !scale.empty()) charts["scale"] = std::move(scale);
  for (const auto& [name, svg] : charts) write_file_atomically(file(name + ".svg"), svg);
  return charts;
}

std::string train_command(int ranks) {
  return ranks > 1 ? "mixtrain launch --nproc " + std::to_string(ranks) + " -- train" : std::string("mixtrain train");
}

} // namespace mixtrain::run
