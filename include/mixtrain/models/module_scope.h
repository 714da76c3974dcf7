#pragma once
/// Module boundaries as places in the program: which module the op running now
/// belongs to, including ops that touch no parameter (an attention score matmul,
/// a residual add, an activation). fp32 islands (PrecisionOptions::keep_fp32) and
/// the overflow tracer's "where" both ask this one place.
///
/// - A C++ forward opens a ModuleScope per child it runs (the built-in models do,
///   and so may yours).
/// - Inside a TorchScript model, the interpreter knows its module calls; they are
///   resolved to the Python attribute paths the model's parameters have
///   ("encoder.layers.0.self_attention").
///
/// Example (a C++ module whose forward names its children):
///   torch::Tensor forward(torch::Tensor x) {
///     { mixtrain::ModuleScope scope("attn"); x = x + attn->forward(x); }
///     mixtrain::ModuleScope scope("mlp");
///     return x + mlp->forward(x);
///   }

#include <c10/core/DispatchKey.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string>
#include <vector>

namespace mixtrain {

/// RAII: ops run on this thread while alive belong to the child `name` of the
/// enclosing scope (a dotted path is fine). Nestable.
class ModuleScope {
 public:
  explicit ModuleScope(const std::string& name);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
};

/// The dotted path of the module the running op belongs to ("" at the top level).
std::string current_module_path();

/// Whether `path` is the module `pattern` names or lies inside it. A pattern is a
/// dotted path whose components may be `*` (any one component):
/// "encoder.layers.*.mlp" matches "encoder.layers.3.mlp" and "encoder.layers.3.mlp.0".
bool module_path_matches(const std::string& pattern, const std::string& path);

/// Which of `patterns` match no module of `paths` (the model's module paths).
std::vector<std::string> unmatched_patterns(const std::vector<std::string>& patterns,
                                            const std::vector<std::string>& paths);

/// The entries of `paths` closest to `name` (shared prefix, then edit distance), at most `n`.
std::vector<std::string> closest_paths(const std::string& name, const std::vector<std::string>& paths, size_t n = 3);

namespace detail {
/// Turns the TorchScript interpreter's module calls ("layers(ModuleList)", "0(Block)")
/// into a Python path; a scripted model installs one for the length of its forward.
class ScriptPathResolver {
 public:
  virtual ~ScriptPathResolver() = default;
  /// `calls`: instance names and classes, outermost first, the root left out.
  virtual std::string resolve(const std::vector<std::pair<std::string, std::string>>& calls) = 0;
};
/// Installs `r` for this thread (nullptr removes it); returns the previous one.
ScriptPathResolver* set_script_path_resolver(ScriptPathResolver* r);

/// The dispatch key amp's per-op modes (fp16/bf16 emulation, fp32 islands, the
/// overflow tracer) work through, here so core code can ask whether they are on.
constexpr c10::DispatchKey kOpModeKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

/// Whether one of those modes watches this thread's ops: a scripted model must
/// then run TorchScript's plain executor, which dispatches every op one by one.
inline bool ops_observed() { return c10::impl::tls_is_dispatch_key_included(kOpModeKey); }
} // namespace detail

} // namespace mixtrain
