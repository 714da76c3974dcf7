#pragma once
/// Crash-safe file replacement.

#include <string>

namespace mixtrain {

/// Writes `bytes` to `path` so that `path` always holds either its old or its
/// new complete content: a temporary file in the same directory, fsync, rename,
/// fsync of the directory. Throws c10::Error naming the path on failure.
void write_file_atomically(const std::string& path, const std::string& bytes);

} // namespace mixtrain
