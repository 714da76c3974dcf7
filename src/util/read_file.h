#pragma once
// Private: reading a whole file, for the idx reader and the checkpoint loader.

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

namespace mixtrain::detail {

/// The bytes of the file at `path`. `role` names the file in errors ("checkpoint "
/// gives "Cannot open checkpoint PATH: ..."); a read error is reported, not read short.
inline std::string read_whole_file(const std::string& path, const std::string& role = "") {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  TORCH_CHECK(f, "Cannot open ", role, path, ": ", std::strerror(errno));
  std::string bytes;
  char chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof(chunk), f.get())) > 0) bytes.append(chunk, got);
  TORCH_CHECK(!std::ferror(f.get()), "Error reading ", role, path);
  return bytes;
}

} // namespace mixtrain::detail
