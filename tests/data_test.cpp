// The idx(.gz) reader on good and corrupt files, Fashion-MNIST loading, and DataLoader.
#include "test_util.h"

#include <mixtrain/data/data.h>
#include <set>
#include <sys/stat.h>

#include <filesystem>

namespace {

using namespace mixtrain;

using test::fake_fashion_dir;
using test::idx_bytes;
using test::read_raw;
using test::write_gz;
using test::write_raw;

TEST(IdxReaderTest, ReadsRawAndGzipped) {
  const std::string dir = test::scratch_dir("idx_good");
  write_raw(dir + "/a.idx", idx_bytes({3, 2, 5}));
  write_gz(dir + "/a.idx.gz", idx_bytes({3, 2, 5}));
  for (const std::string f : {"/a.idx", "/a.idx.gz"}) {
    torch::Tensor t = data::read_idx(dir + f);
    EXPECT_EQ(t.sizes(), (std::vector<int64_t>{3, 2, 5}));
    EXPECT_EQ(t.scalar_type(), torch::kByte);
    EXPECT_EQ(t.flatten()[11].item<int>(), (11 * 7) % 251);
  }
}

TEST(IdxReaderTest, RejectsCorruptFiles) {
  const std::string dir = test::scratch_dir("idx_bad");
  EXPECT_THROW_WITH(data::read_idx(dir + "/missing.gz"), "Cannot open");

  write_raw(dir + "/plain.gz", idx_bytes({4}));
  EXPECT_THROW_WITH(data::read_idx(dir + "/plain.gz"), "is not a gzip file");

  auto bad_magic = idx_bytes({4});
  bad_magic[0] = 0x1f;
  write_gz(dir + "/magic.gz", bad_magic);
  EXPECT_THROW_WITH(data::read_idx(dir + "/magic.gz"), "bad idx magic");

  write_gz(dir + "/float.gz", idx_bytes({4}, 0x0d));
  EXPECT_THROW_WITH(data::read_idx(dir + "/float.gz"), "only unsigned byte");

  auto short_payload = idx_bytes({10, 10});
  short_payload.resize(short_payload.size() - 5);
  write_gz(dir + "/short.gz", short_payload);
  EXPECT_THROW_WITH(data::read_idx(dir + "/short.gz"), "header declares 100 values but only 95");

  auto trailing = idx_bytes({4});
  trailing.push_back(9);
  write_gz(dir + "/trailing.gz", trailing);
  EXPECT_THROW_WITH(data::read_idx(dir + "/trailing.gz"), "trailing bytes");

  write_gz(dir + "/header.gz", {0, 0, 8, 3, 0, 0});
  EXPECT_THROW_WITH(data::read_idx(dir + "/header.gz"), "truncated inside its idx header");

  // A gzip stream cut at several offsets: never a crash, always a named problem.
  write_gz(dir + "/whole.gz", idx_bytes({50, 28, 28}));
  const auto whole = read_raw(dir + "/whole.gz");
  for (size_t cut : {size_t(3), size_t(12), whole.size() / 2, whole.size() - 9, whole.size() - 1}) {
    write_raw(dir + "/cut.gz", std::vector<uint8_t>(whole.begin(), whole.begin() + cut));
    EXPECT_THROW_WITH(data::read_idx(dir + "/cut.gz"), "cut.gz");
  }
  // A flipped byte in the compressed body is caught (by inflate or by the CRC).
  auto flipped = whole;
  flipped[whole.size() / 2] ^= 0xff;
  write_raw(dir + "/flipped.gz", flipped);
  EXPECT_THROW_WITH(data::read_idx(dir + "/flipped.gz"), "flipped.gz");
}

// As gzip reads them: members one after another, and zero padding after the last.
TEST(IdxReaderTest, ReadsGzipMembersAndZeroPaddingAsGzipDoes) {
  const std::string dir = test::scratch_dir("idx_members");
  const auto bytes = idx_bytes({6, 28, 28});
  write_gz(dir + "/a.gz", std::vector<uint8_t>(bytes.begin(), bytes.begin() + 1000));
  write_gz(dir + "/b.gz", std::vector<uint8_t>(bytes.begin() + 1000, bytes.end()));
  auto joined = read_raw(dir + "/a.gz");
  const auto b = read_raw(dir + "/b.gz");
  joined.insert(joined.end(), b.begin(), b.end());  // cat a.gz b.gz
  write_raw(dir + "/joined.gz", joined);
  EXPECT_TRUE(torch::equal(data::read_idx(dir + "/joined.gz"), data::parse_idx(bytes.data(), bytes.size(), false, "raw")));

  auto padded = joined;
  padded.resize(padded.size() + (3 << 20), 0);  // a 3 MB tape block of zeros
  write_raw(dir + "/padded.gz", padded);
  EXPECT_EQ(data::read_idx(dir + "/padded.gz").size(0), 6);

  auto junk = padded;
  junk.push_back('x');
  write_raw(dir + "/junk.gz", junk);
  EXPECT_THROW_WITH(data::read_idx(dir + "/junk.gz"), "neither zero padding nor another gzip member");
}

TEST(IdxReaderTest, AFileOfTheOtherKindIsNamedByItsMagic) {
  const auto labels = idx_bytes({100});
  EXPECT_THROW_WITH(data::parse_idx(labels.data(), labels.size(), false, "images", 3),
                    "images has the idx magic of 1-d data (0x00000801, as label files have) but is read as 3-d data");
  // An image file carrying the label magic: named so, not "trailing bytes".
  auto images = idx_bytes({100, 28, 28});
  images[3] = 1;
  EXPECT_THROW_WITH(data::parse_idx(images.data(), images.size(), false, "images", 3), "the idx magic of 1-d data");
  const std::string dir = fake_fashion_dir("fake_fashion_swapped", 64, 16);
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", idx_bytes({16}));
  EXPECT_THROW_WITH(data::fashion_mnist(dir), "is it the other file of the pair?");
}

TEST(IdxReaderTest, OnlyRegularFilesAreRead) {
  const std::string dir = test::scratch_dir("idx_special");
  std::filesystem::create_symlink("/dev/zero", dir + "/zero.gz");
  EXPECT_THROW_WITH(data::read_idx(dir + "/zero.gz"), "not a regular file (a device or socket)");
  ASSERT_EQ(::mkfifo((dir + "/fifo.gz").c_str(), 0600), 0);
  EXPECT_THROW_WITH(data::read_idx(dir + "/fifo.gz"), "not a regular file (a pipe)");  // and does not wait for a writer
  EXPECT_THROW_WITH(data::load_tensor_file(dir + "/fifo.gz"), "not a regular file (a pipe)");
}

// The hostile tester's files: a tensor whose sizes claim more than the file's
// storage holds for it. libtorch 1.13's unpickler built it anyway (the first op that
// touched it read out of bounds: a segfault); torch 2.x's refuses it. Every input the
// tensor_file fuzzer once found stays a clean error.
TEST(TensorFileTest, ATensorReachingPastItsStorageIsRefused) {
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(MIXTRAIN_SOURCE_DIR "/fuzz/regressions/tensor_file")) {
    SCOPED_TRACE(entry.path().string());
    const auto bytes = read_raw(entry.path().string());
    EXPECT_THROW_WITH(data::parse_tensor_file(std::string(bytes.begin(), bytes.end()), "regression"), "regression");
    ++seen;
  }
  EXPECT_GE(seen, 1);
  EXPECT_THROW_WITH(data::load_tensor_file(MIXTRAIN_SOURCE_DIR "/fuzz/regressions/tensor_file/rows-past-storage.pt"),
                    "is damaged: a tensor of shape [300, 7] needs 8400 bytes of data but the file holds 2800 for it");
  // Stride 0 fits any storage, but 2^40 rows of it do not fit in memory: said, not a raw allocation error.
  EXPECT_THROW_WITH(data::load_tensor_file(MIXTRAIN_SOURCE_DIR "/fuzz/regressions/tensor_file/stride-0-2e40-rows.pt"),
                    "'x' of shape [1099511627776, 7] is a view (strides [0, 1]) that needs 30786.3 GB as data, more than "
                    "this machine's");
  // The seeds (real torch.save files, a view with an offset among them) read as they are.
  for (const auto& entry : std::filesystem::directory_iterator(MIXTRAIN_SOURCE_DIR "/fuzz/seeds/tensor_file")) {
    SCOPED_TRACE(entry.path().string());
    EXPECT_GT(data::load_tensor_file(entry.path().string()).train.size(), 0);
  }
}

TEST(FashionMnistTest, LoadsNormalizesAndChecksCounts) {
  const std::string dir = fake_fashion_dir("fashion_small", 20, 10);
  auto split = data::fashion_mnist(dir);
  EXPECT_EQ(split.train.x.sizes(), (std::vector<int64_t>{20, 1, 28, 28}));
  EXPECT_EQ(split.valid.size(), 10);
  EXPECT_EQ(split.train.y.scalar_type(), torch::kLong);
  // pixel 0 of image 0 is 0: normalized to -mean/std.
  EXPECT_NEAR(split.train.x[0][0][0][0].item<double>(), -0.2860 / 0.3530, 1e-5);

  write_gz(dir + "/train-labels-idx1-ubyte.gz", idx_bytes({19}));
  EXPECT_THROW_WITH(data::fashion_mnist(dir), "has 20 images but");
}

TEST(FashionMnistTest, RealDatasetWhenInstalled) {
  if (!std::filesystem::exists(std::string(data::kFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  auto split = data::fashion_mnist();
  EXPECT_EQ(split.train.size(), 60000);
  EXPECT_EQ(split.valid.size(), 10000);
  // Normalization with the dataset's own statistics gives mean ~0, std ~1.
  EXPECT_NEAR(split.train.x.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(split.train.x.std().item<double>(), 1.0, 0.01);
  EXPECT_EQ(std::get<0>(at::_unique(split.train.y)).numel(), 10);
}

TEST(DataLoaderTest, BatchesDropLastAndReproducibleShuffle) {
  data::Dataset ds{torch::arange(10).to(torch::kFloat).unsqueeze(1), torch::arange(10)};
  data::DataLoader seq(ds, data::DataLoaderOptions().batch_size(4));
  EXPECT_EQ(seq.num_batches(), 3);
  std::vector<int64_t> sizes;
  for (auto b : seq) sizes.push_back(b.size());
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));

  auto epoch_order = [](data::DataLoader& dl) {
    std::vector<int64_t> order;
    for (auto b : dl)
      for (int64_t i = 0; i < b.size(); ++i) order.push_back(b.y[i].item<int64_t>());
    return order;
  };
  auto opts = data::DataLoaderOptions().batch_size(4).shuffle(true).drop_last(true).seed(7);
  data::DataLoader a(ds, opts), b(ds, opts);
  EXPECT_EQ(a.num_batches(), 2);
  const auto a1 = epoch_order(a), a2 = epoch_order(a), b1 = epoch_order(b);
  EXPECT_EQ(a1.size(), 8u);
  EXPECT_EQ(a1, b1);  // same seed, same order
  EXPECT_NE(a1, a2);  // a new permutation every epoch
  EXPECT_EQ(std::set<int64_t>(a1.begin(), a1.end()).size(), 8u);  // no sample twice

  EXPECT_THROW_WITH(data::DataLoader(ds, data::DataLoaderOptions().batch_size(0)), "Invalid batch_size");
  EXPECT_THROW_WITH(data::DataLoader(data::Dataset{torch::zeros({3, 1}), torch::zeros({4})}, {}), "but y has 4");
}

} // namespace
