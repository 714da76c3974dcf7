#include "mixtrain/util/atomic_file.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <streambuf>

namespace mixtrain {

namespace {

std::string temp_path_of(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

int open_temp(const std::string& path, const std::string& tmp) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw FileWriteError(path, "Cannot write " + path + ": " + std::strerror(errno));
  return fd;
}

/// Writes all `n` bytes; false (errno set) when the disk refuses.
bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = EIO;
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

[[noreturn]] void fail(const std::string& path, const std::string& tmp, int fd, const std::string& why) {
  ::close(fd);
  ::unlink(tmp.c_str());
  throw FileWriteError(path, "Writing " + path + " failed: " + why);
}

/// fsync, rename into place, and fsync of the directory (the rename is durable then).
void commit(const std::string& path, const std::string& tmp, int fd) {
  const bool synced = ::fsync(fd) == 0;
  const int sync_err = errno;
  ::close(fd);
  if (!synced) {
    ::unlink(tmp.c_str());
    throw FileWriteError(path, "fsync of " + path + " failed: " + std::strerror(sync_err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw FileWriteError(path, "Cannot move the new file into place at " + path + ": " + std::strerror(err));
  }
  const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

/// An output stream buffer over a file descriptor that keeps the first write error.
/// Seeking is only telling where it is (libtorch's writers ask).
class FdStreamBuf final : public std::streambuf {
 public:
  explicit FdStreamBuf(int fd) : fd_(fd) { setp(buf_, buf_ + sizeof buf_); }
  int error() const { return error_; }

 protected:
  int_type overflow(int_type c) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n < static_cast<std::streamsize>(sizeof buf_)) return std::streambuf::xsputn(s, n);
    if (!drain() || !put(s, static_cast<size_t>(n))) return 0;  // large pieces go straight to the file
    return n;
  }
  int sync() override { return drain() ? 0 : -1; }
  pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode) override {
    if (off != 0 || dir != std::ios_base::cur) return pos_type(off_type(-1));
    return pos_type(static_cast<off_type>(written_ + static_cast<size_t>(pptr() - pbase())));
  }

 private:
  bool put(const char* p, size_t n) {
    if (error_ != 0) return false;
    if (!write_all(fd_, p, n)) {
      error_ = errno;
      return false;
    }
    written_ += n;
    return true;
  }
  bool drain() {
    const size_t n = static_cast<size_t>(pptr() - pbase());
    if (n > 0 && !put(pbase(), n)) return false;
    setp(buf_, buf_ + sizeof buf_);
    return true;
  }
  int fd_;
  int error_ = 0;
  size_t written_ = 0;
  char buf_[1 << 16];
};

std::string first_line_of(const char* what) {
  const std::string s(what);
  return s.substr(0, s.find('\n'));
}

} // namespace

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = temp_path_of(path);
  const int fd = open_temp(path, tmp);
  if (!write_all(fd, bytes.data(), bytes.size())) fail(path, tmp, fd, std::strerror(errno));
  commit(path, tmp, fd);
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream& out)>& write) {
  write_file_atomically(path, write, [] { return std::string(); });
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream& out)>& write,
                           const std::function<std::string()>& header) {
  const std::string tmp = temp_path_of(path);
  const int fd = open_temp(path, tmp);
  FdStreamBuf buf(fd);
  std::ostream out(&buf);
  try {
    write(out);
    out.flush();
  } catch (const std::exception& e) {
    fail(path, tmp, fd, buf.error() != 0 ? std::strerror(buf.error()) : first_line_of(e.what()));
  }
  if (buf.error() != 0 || !out) fail(path, tmp, fd, buf.error() != 0 ? std::strerror(buf.error()) : "the stream failed");
  const std::string head = header();
  for (size_t done = 0; done < head.size();) {
    const ssize_t n = ::pwrite(fd, head.data() + done, head.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path, tmp, fd, std::strerror(n < 0 ? errno : EIO));
    done += static_cast<size_t>(n);
  }
  commit(path, tmp, fd);
}

} // namespace mixtrain
