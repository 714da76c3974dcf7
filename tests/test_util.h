#pragma once
// Shared test helpers: a seeding fixture, error-message assertions, tiny data.

#include <gtest/gtest.h>
#include <mixtrain/data/data.h>
#include <mixtrain/core/learner.h>
#include <mixtrain/util/phrase.h>
#include <mixtrain/callbacks/fault_injection.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <iterator>
#include <string>

/// Asserts that `stmt` throws (any std::exception) and that the message contains `substr`.
#define EXPECT_THROW_WITH(stmt, substr)                                                   \
  do {                                                                                    \
    bool thrown_ = false;                                                                 \
    try {                                                                                 \
      stmt;                                                                               \
    } catch (const std::exception& e_) {                                                  \
      thrown_ = true;                                                                     \
      EXPECT_NE(std::string(e_.what()).find(substr), std::string::npos)                   \
          << "message was: " << e_.what();                                                \
    }                                                                                     \
    EXPECT_TRUE(thrown_) << #stmt " did not throw";                                       \
  } while (0)

namespace mixtrain::test {

/// Whether any of `v` contains `what` (findings and fixes, in the library's words).
inline bool contains(const std::vector<std::string>& v, const std::string& what) {
  for (const auto& s : v)
    if (s.find(what) != std::string::npos) return true;
  return false;
}
inline bool contains(const std::vector<mixtrain::Phrase>& v, const std::string& what) {
  for (const auto& p : v)
    if (p.str().find(what) != std::string::npos) return true;
  return false;
}

/// Whether torch is importable by the Python the build was configured with (MIXTRAIN_PYTHON).
inline bool python_torch_available() {
  static const bool available = std::system(MIXTRAIN_PYTHON " -c 'import torch' > /dev/null 2>&1") == 0;
  return available;
}
/// The message every test that needs python3-torch fails with when it is missing.
constexpr const char* kNoPythonTorch =
    "the build's Python (MIXTRAIN_PYTHON) cannot import torch: these tests export models with it; run scripts/setup.sh (make test does)";

/// Fixes torch's global seed and one thread, so every test is deterministic.
class SeededTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    torch::set_num_threads(1);
  }
};

/// `n` points around `classes` well-separated Gaussian centers in `dim` dimensions.
/// The centers depend on `centers_seed` only, so a training and a validation set
/// drawn with different `seed`s come from the same distribution.
inline mixtrain::data::Dataset blobs(int64_t n, int64_t classes = 3, int64_t dim = 4, uint64_t seed = 1,
                                     uint64_t centers_seed = 0) {
  auto center_gen = at::detail::createCPUGenerator(centers_seed);
  torch::Tensor centers = torch::randn({classes, dim}, center_gen) * 3;
  auto gen = at::detail::createCPUGenerator(seed);
  torch::Tensor y = torch::randint(classes, {n}, gen, torch::kLong);
  torch::Tensor x = centers.index_select(0, y) + torch::randn({n, dim}, gen) * 0.5;
  return {x, y};
}

/// 8 -> Linear(32) -> LayerNorm -> ReLU -> Linear(3): the new user's LayerNorm MLP in
/// small. Fine-tuned in bf16-pure at a low lr it loses most updates (lost_updates).
struct NormMlpImpl : torch::nn::Module {
  NormMlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 32))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})))),
        fc2(register_module("fc2", torch::nn::Linear(32, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(norm(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc2;
};
TORCH_MODULE(NormMlp);

using mixtrain::testing::InjectOverflow;

/// The loss scale of every recorded step (skipped ones included): the Recorder
/// holds the scale history.
inline std::vector<double> recorded_scales(mixtrain::Learner& learn) {
  std::vector<double> scales;
  for (const auto& s : learn.recorder().steps()) scales.push_back(s.scale);
  return scales;
}

/// Every tensor of `a` equals its counterpart in `b`, element for element.
inline void expect_bitwise_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

/// A fresh scratch directory under the build tree.
inline std::string scratch_dir(const std::string& name) {
  const std::string dir = std::string(MIXTRAIN_TEST_TMP) + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// Bytes of an unsigned-byte idx file with the given dims and deterministic contents.
inline std::vector<uint8_t> idx_bytes(std::vector<uint32_t> dims, uint8_t type = 0x08, int fill_seed = 0) {
  std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  uint64_t n = 1;
  for (uint32_t d : dims) {
    b.push_back(d >> 24); b.push_back(d >> 16); b.push_back(d >> 8); b.push_back(d);
    n *= d;
  }
  for (uint64_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>((i * 7 + fill_seed) % 251));
  return b;
}

inline void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

inline void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
  gzclose(f);
}

inline std::vector<uint8_t> read_raw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// A Fashion-MNIST-shaped directory with n_train / n_test images.
inline std::string fake_fashion_dir(const std::string& name, uint32_t n_train, uint32_t n_test) {
  const std::string dir = scratch_dir(name);
  write_gz(dir + "/train-images-idx3-ubyte.gz", idx_bytes({n_train, 28, 28}));
  auto labels = idx_bytes({n_train});
  for (size_t i = 8; i < labels.size(); ++i) labels[i] %= 10;
  write_gz(dir + "/train-labels-idx1-ubyte.gz", labels);
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", idx_bytes({n_test, 28, 28}));
  auto tlabels = idx_bytes({n_test});
  for (size_t i = 8; i < tlabels.size(); ++i) tlabels[i] %= 10;
  write_gz(dir + "/t10k-labels-idx1-ubyte.gz", tlabels);
  return dir;
}

/// Whether an op hands a value to the host: the ops that return host numbers
/// (item() and the ops built on it) and moves to the CPU from a device, or
/// explicit copies there (what read_to_host does, so it is seen on the CPU too).
/// Ops are seen at the top level: item(), not the _local_scalar_dense inside it.
inline bool reads_host(const std::string& name, c10::ArrayRef<c10::IValue> in) {
  if (name == "aten::item" || name == "aten::_local_scalar_dense" || name == "aten::is_nonzero" ||
      name == "aten::equal" || name == "aten::allclose")
    return true;
  if (in.empty() || !in[0].isTensor()) return false;
  const bool from_device = !in[0].toTensor().is_cpu();
  const auto to_cpu = [&in](size_t i) { return in.size() > i && in[i].isDevice() && in[i].toDevice().is_cpu(); };
  // to.device(self, device, dtype, non_blocking, copy, memory_format)
  if (name == "aten::to" && in.size() == 6 && to_cpu(1)) return from_device || in[4].toBool();
  // to.dtype_layout(self, dtype, layout, device, pin_memory, non_blocking, copy, memory_format)
  if (name == "aten::to" && in.size() == 8 && to_cpu(3)) return from_device || in[6].toBool();
  if (name == "aten::_to_copy" && to_cpu(3)) return true;
  if (name == "aten::copy_" && in.size() > 1 && in[1].isTensor()) return in[0].toTensor().is_cpu() && !in[1].toTensor().is_cpu();
  return false;
}

} // namespace mixtrain::test
