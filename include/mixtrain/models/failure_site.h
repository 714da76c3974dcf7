#pragma once
/// Where a forward failed: the op and the module, for errors that otherwise name
/// neither. A TorchScript model's error is "The following operation failed in
/// the TorchScript interpreter." followed by a traceback of source lines, which
/// names no module instance (a ModuleList's `l(x)` could be any layer); libtorch's
/// own kernels say what is wrong ("mat1 and mat2 shapes cannot be multiplied")
/// but not where. The failing forward is run once more while every op is
/// watched, and the place the exception leaves from is read off the module
/// boundaries (module_scope.h).

#include <exception>
#include <functional>
#include <optional>
#include <string>

namespace mixtrain {

struct FailureSite {
  std::string op;      ///< the top-level op that threw ("aten::linear")
  std::string module;  ///< the module path it belongs to ("block.layers.1"); "" at the top level
  /// "block.layers.1 (aten::linear)", or "aten::linear" at the top level.
  std::string str() const;
};

/// Runs `rerun` (the forward that failed, again) while watching every op on this
/// thread, and returns where its exception left from; nullopt when it succeeded
/// this time, or failed outside any op (a `raise` in the model: its module is not
/// known; source_line_of says where it is). Its exception is swallowed: the caller has the first one.
std::optional<FailureSite> locate_failure(const std::function<void()>& rerun);

/// Where a TorchScript error was raised in the model's source ("model.py:7", the
/// traceback's innermost frame), or "" when the error carries no traceback.
std::string source_line_of(const std::exception& e);

/// Where the forward that threw `e` failed, for an error line: the module and op
/// ("in layers.1 (aten::linear)", found by rerunning the forward with `rerun`), else
/// the model's source line ("at model.py:34", for a `raise`), else "".
std::string failure_place(const std::exception& e, const std::function<void()>& rerun);

/// The line that says what failed: TorchScript's interpreter puts its traceback
/// first and the failing op's own message last ("RuntimeError: boom"); other
/// errors, their first line.
std::string innermost_message(const std::exception& e);

} // namespace mixtrain
