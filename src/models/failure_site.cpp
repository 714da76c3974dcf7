#include "mixtrain/models/failure_site.h"

#include "mixtrain/models/module_scope.h"
#include "util/first_line.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <vector>

namespace mixtrain {

namespace {

struct Watch {
  std::vector<FailureSite> open;         // the ops running now, outermost first
  std::optional<FailureSite> failed_at;  // set by the first op an exception leaves
};
thread_local Watch* t_watch = nullptr;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (t_watch) {
    t_watch->open.push_back(FailureSite{fn.name(), current_module_path()});
  }
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  if (!t_watch || t_watch->open.empty()) return;
  // Ended by an exception passing through: the outermost op still open is the one
  // the model called (aten::linear, not the aten::mm inside it).
  if (std::uncaught_exceptions() > 0 && !t_watch->failed_at) t_watch->failed_at = t_watch->open.front();
  t_watch->open.pop_back();
}

} // namespace

std::string FailureSite::str() const { return module.empty() ? op : module + " (" + op + ")"; }

std::optional<FailureSite> locate_failure(const std::function<void()>& rerun) {
  Watch watch;
  Watch* previous = t_watch;
  t_watch = &watch;
  const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end).scopes({at::RecordScope::FUNCTION}));
  bool failed = false;
  try {
    rerun();
  } catch (...) {
    failed = true;
  }
  at::removeCallback(handle);
  t_watch = previous;
  if (!failed) return std::nullopt;
  // Outside any op (a `raise`, a check in C++) the module is not known: the last
  // op's module would often name the wrong one, as the raise runs after it.
  return watch.failed_at;
}

std::string innermost_message(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  if (text.rfind("The following operation failed in the TorchScript interpreter", 0) != 0) return detail::first_line(text);
  // The traceback's last line is the error itself: "RuntimeError: mat1 and ...",
  // or for a `raise` in the model "builtins.RuntimeError: boom".
  const size_t end = text.find_last_not_of('\n');
  if (end == std::string::npos) return text;
  const size_t begin = text.rfind('\n', end);
  const std::string line = text.substr(begin == std::string::npos ? 0 : begin + 1, end - (begin == std::string::npos ? 0 : begin + 1) + 1);
  const size_t colon = line.find(": ");
  const std::string kind = colon == std::string::npos ? "" : line.substr(0, colon);
  const bool named = kind.size() > 5 && (kind.compare(kind.size() - 5, 5, "Error") == 0 ||
                                         (kind.size() > 9 && kind.compare(kind.size() - 9, 9, "Exception") == 0));
  return named ? line.substr(colon + 2) : line;
}

std::string failure_place(const std::exception& e, const std::function<void()>& rerun) {
  if (const auto site = locate_failure(rerun)) return "in " + site->str();
  const std::string source = source_line_of(e);
  return source.empty() ? "" : "at " + source;
}

std::string source_line_of(const std::exception& e) {
  const std::string text = e.what();
  const size_t file = text.rfind("File \"");
  if (file == std::string::npos) return "";
  const size_t quote = text.find('"', file + 6);
  const std::string line_marker = "\", line ";
  if (quote == std::string::npos || text.compare(quote, line_marker.size(), line_marker) != 0) return "";
  const size_t digits = quote + line_marker.size();
  const size_t end = text.find_first_not_of("0123456789", digits);
  if (end == digits) return "";
  return text.substr(file + 6, quote - file - 6) + ":" + text.substr(digits, end - digits);
}

} // namespace mixtrain
