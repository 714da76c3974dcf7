#include "mixtrain/models/module_scope.h"

#include <torch/csrc/jit/runtime/interpreter.h>

#include <algorithm>
#include <sstream>

namespace mixtrain {

namespace {
thread_local std::vector<std::string> t_scopes;
thread_local detail::ScriptPathResolver* t_resolver = nullptr;

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> out;
  std::stringstream in(path);
  for (std::string part; std::getline(in, part, '.');) out.push_back(part);
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
} // namespace

ModuleScope::ModuleScope(const std::string& name) { t_scopes.push_back(name); }
ModuleScope::~ModuleScope() { t_scopes.pop_back(); }

std::string current_module_path() {
  std::string path;
  for (const auto& s : t_scopes) path += (path.empty() ? "" : ".") + s;
  if (!t_resolver) return path;
  // Frames look like "TOP(Net)::forward", "encoder(Encoder)::forward", "::relu" (a function).
  std::vector<std::pair<std::string, std::string>> calls;
  for (const std::string& frame : torch::jit::currentModuleHierarchy()) {
    const size_t open = frame.find('(');
    if (open == std::string::npos || open == 0) continue;
    const std::string instance = frame.substr(0, open);
    if (instance == "TOP") continue;
    const size_t close = frame.find(')', open);
    calls.emplace_back(instance, frame.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1));
  }
  if (calls.empty()) return path;
  const std::string script = t_resolver->resolve(calls);
  return path.empty() ? script : script.empty() ? path : path + "." + script;
}

bool module_path_matches(const std::string& pattern, const std::string& path) {
  const auto p = split_path(pattern), q = split_path(path);
  if (p.empty() || q.size() < p.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != "*" && p[i] != q[i]) return false;
  return true;
}

std::vector<std::string> unmatched_patterns(const std::vector<std::string>& patterns, const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& pattern : patterns)
    if (std::none_of(paths.begin(), paths.end(), [&](const std::string& p) { return module_path_matches(pattern, p); }))
      out.push_back(pattern);
  return out;
}

std::vector<std::string> closest_paths(const std::string& name, const std::vector<std::string>& paths, size_t n) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& p : paths) {
    if (p.empty()) continue;
    scored.emplace_back(edit_distance(name, p), p);
  }
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && out.size() < n; ++i) out.push_back(scored[i].second);
  return out;
}

namespace detail {
ScriptPathResolver* set_script_path_resolver(ScriptPathResolver* r) {
  ScriptPathResolver* previous = t_resolver;
  t_resolver = r;
  return previous;
}
} // namespace detail

} // namespace mixtrain
