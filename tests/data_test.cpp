// The idx(.gz) reader on good and corrupt files, Fashion-MNIST loading, and DataLoader.
#include "test_util.h"

#include <mixtrain/data/data.h>
#include <set>

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
