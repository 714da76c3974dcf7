#pragma once
// Private: reading files, for the idx reader, the tensor-file reader, the text
// corpus and the checkpoint loader.
//
// Only a regular file is read, and only as many bytes as it held when opened: a
// symlink to /dev/zero or a FIFO is refused at once, not read without end (a
// FIFO is opened non-blocking, so it does not wait for a writer either).

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

namespace mixtrain::detail {

/// An open regular file and its size, closed on destruction.
class RegularFile {
 public:
  /// `role` names the file in errors ("checkpoint " gives "Cannot open checkpoint PATH: ...").
  RegularFile(const std::string& path, const std::string& role) : path_(path), role_(role) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    TORCH_CHECK(fd_ >= 0, "Cannot open ", role, path, ": ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      const int err = errno;
      const bool stat_ok = ::fstat(fd_, &st) == 0;
      ::close(fd_);
      TORCH_CHECK(stat_ok, "Cannot read ", role, path, ": ", std::strerror(err));
      TORCH_CHECK(false, "Cannot read ", role, path, ": not a regular file (",
                  S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a pipe" : "a device or socket", ")");
    }
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
    size_ = static_cast<size_t>(st.st_size);
  }
  ~RegularFile() { ::close(fd_); }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  size_t size() const { return size_; }

  /// Reads up to `n` bytes into `out`; 0 at the end. A read error is reported, not read short.
  size_t read(char* out, size_t n) {
    for (;;) {
      const ssize_t got = ::read(fd_, out, n);
      if (got < 0 && errno == EINTR) continue;
      TORCH_CHECK(got >= 0, "Error reading ", role_, path_, ": ", std::strerror(errno));
      return static_cast<size_t>(got);
    }
  }

 private:
  std::string path_, role_;
  int fd_ = -1;
  size_t size_ = 0;
};

/// The bytes of the regular file at `path`, refused when it is larger than `max_bytes`
/// (the most its format allows).
inline std::string read_whole_file(const std::string& path, const std::string& role = "",
                                   size_t max_bytes = std::numeric_limits<size_t>::max()) {
  RegularFile f(path, role);
  TORCH_CHECK(f.size() <= max_bytes, "Cannot read ", role, path, ": it is ", f.size(), " bytes, more than such a file can be (",
              max_bytes, ")");
  std::string bytes(f.size(), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const size_t n = f.read(&bytes[done], bytes.size() - done);
    if (n == 0) break;  // shrank while being read: what is there
    done += n;
  }
  bytes.resize(done);
  return bytes;
}

/// The most a run folder's own records are read to (args.json, summary.json, steps.csv):
/// steps.csv of a million steps is about 60 MB.
inline constexpr size_t kMaxRunFileBytes = size_t{256} << 20;

/// Calls `use(chunk, n)` on the regular file's bytes in order, a chunk at a time
/// (for a reader that never needs the file whole).
template <typename Use>
void read_file_chunks(const std::string& path, const std::string& role, Use&& use) {
  RegularFile f(path, role);
  char chunk[1 << 16];
  size_t left = f.size();
  while (left > 0) {
    const size_t n = f.read(chunk, std::min(sizeof(chunk), left));
    if (n == 0) break;
    use(chunk, n);
    left -= n;
  }
}

} // namespace mixtrain::detail
