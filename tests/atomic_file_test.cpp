// Crash-safe file writes: a path holds its old content or its new, whole; the streamed
// form (models and archives of gigabytes) never holds the file in memory and fails the
// same way.
#include "test_util.h"

#include <mixtrain/util/atomic_file.h>

#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace {

namespace fs = std::filesystem;
using mixtrain::FileWriteError;
using mixtrain::write_file_atomically;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool has_temp_files(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

TEST(AtomicFileTest, AStreamedFileIsWrittenWholeAndTellsWhereItIs) {
  const std::string dir = mixtrain::test::scratch_dir("atomic_stream");
  const std::string path = dir + "/big.bin";
  // Small pieces (buffered) and a piece larger than the buffer (written straight through).
  const std::string large(200000, 'x');
  std::streampos told = -1;
  write_file_atomically(path, [&](std::ostream& out) {
    out << "head:";
    told = out.tellp();
    out.write(large.data(), static_cast<std::streamsize>(large.size()));
    out << ":tail";
  });
  EXPECT_EQ(told, std::streampos(5));
  EXPECT_EQ(read_all(path), "head:" + large + ":tail");
  EXPECT_FALSE(has_temp_files(dir));
}

// A header that sums up what follows (a checkpoint's size and CRC) goes over its placeholder last.
TEST(AtomicFileTest, AHeaderComputedFromTheStreamReplacesItsPlaceholder) {
  const std::string dir = mixtrain::test::scratch_dir("atomic_header");
  const std::string path = dir + "/checkpoint.pt";
  size_t body = 0;
  write_file_atomically(
      path,
      [&](std::ostream& out) {
        out << "????";
        const std::string data(100000, 'z');
        out.write(data.data(), static_cast<std::streamsize>(data.size()));
        body = data.size();
      },
      [&] { return std::to_string(body).substr(0, 4); });
  const std::string got = read_all(path);
  EXPECT_EQ(got.size(), 4 + body);
  EXPECT_EQ(got.substr(0, 4), "1000");
  EXPECT_EQ(got.substr(4, 3), "zzz");
  EXPECT_FALSE(has_temp_files(dir));
}

TEST(AtomicFileTest, AWriterThatThrowsLeavesTheOldContentAndNoTempFile) {
  const std::string dir = mixtrain::test::scratch_dir("atomic_throw");
  const std::string path = dir + "/model.pt";
  write_file_atomically(path, std::string("old"));
  try {
    write_file_atomically(path, [](std::ostream& out) {
      out << "partial";
      throw std::runtime_error("the serializer broke\nsecond line");
    });
    FAIL() << "no FileWriteError";
  } catch (const FileWriteError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_NE(std::string(e.what()).find("Writing " + path + " failed: the serializer broke"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("second line"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_all(path), "old");
  EXPECT_FALSE(has_temp_files(dir));
}

// A full disk, as a file-size limit makes one (SIGXFSZ ignored, as the CLI ignores it):
// the disk's own words, the old content, no temp file.
TEST(AtomicFileTest, AFullDiskWhileStreamingSaysSoAndLeavesTheOldContent) {
  const std::string dir = mixtrain::test::scratch_dir("atomic_full");
  const std::string path = dir + "/model.pt";
  write_file_atomically(path, std::string("old"));
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit limit = old_limit;
  limit.rlim_cur = 100000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  const std::string large(300000, 'y');
  std::string message;
  try {
    write_file_atomically(path, [&](std::ostream& out) { out.write(large.data(), static_cast<std::streamsize>(large.size())); });
  } catch (const FileWriteError& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(message.find("Writing " + path + " failed: File too large"), std::string::npos) << message;
  EXPECT_EQ(read_all(path), "old");
  EXPECT_FALSE(has_temp_files(dir));
}

} // namespace
