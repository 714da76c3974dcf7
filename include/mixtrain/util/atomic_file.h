#pragma once
/// Crash-safe file replacement.

#include <c10/util/Exception.h>

#include <functional>
#include <ostream>
#include <string>

namespace mixtrain {

/// What write_file_atomically throws: `path` still holds its old content (or is
/// still absent), and no temp file is left behind.
class FileWriteError : public c10::Error {
 public:
  FileWriteError(std::string path, const std::string& message)
      : c10::Error(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Writes `bytes` to `path` so that `path` always holds either its old or its
/// new complete content: a temporary file in the same directory, fsync, rename,
/// fsync of the directory. Throws FileWriteError naming the path on failure.
void write_file_atomically(const std::string& path, const std::string& bytes);

/// The same for a file that `write` streams into `out` (through a 64 KiB buffer), so a
/// model or archive of gigabytes is never held whole in memory. A write that fails, or
/// an exception from `write`, is a FileWriteError (the exception's first line when the
/// disk said nothing); `path` keeps its old content.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream& out)>& write);

/// The same, then the file's first bytes, which `write` left as placeholders, replaced by
/// what `header` returns (a header that sums up what follows: a checkpoint's size and CRC).
void write_file_atomically(const std::string& path, const std::function<void(std::ostream& out)>& write,
                           const std::function<std::string()>& header);

} // namespace mixtrain
