// settle_malloc_for_training: a Learner starts glibc's malloc where its own sliding would
// end, so that a step's activation-sized blocks come from the heap from the first step
// instead of each being mapped, faulted in and unmapped again.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace {

using namespace mixtrain;

#if defined(__GLIBC__)
/// A block of `bytes`, kept (freeing a mapped block would itself slide glibc's thresholds),
/// and how many bytes glibc mapped for it (0: it came from the heap).
std::pair<void*, size_t> allocate_and_measure(size_t bytes) {
  const struct mallinfo2 before = mallinfo2();
  void* p = std::malloc(bytes);
  std::memset(p, 1, bytes);
  const struct mallinfo2 after = mallinfo2();
  return {p, after.hblkhd - before.hblkhd};
}
#endif

TEST(MallocSettingsTest, ALearnerTakesActivationSizedBlocksFromTheHeapFromItsFirstStep) {
#if !defined(__GLIBC__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "glibc's malloc only (not under AddressSanitizer's allocator)";
#else
  if (std::getenv("GLIBC_TUNABLES")) GTEST_SKIP() << "GLIBC_TUNABLES chose the thresholds";
  // Just below glibc's most: only a block of 30-32 MiB freed earlier in this process would
  // have slid its threshold past this size (ctest runs the test in a process of its own).
  constexpr size_t kBlock = size_t{30} << 20;
  const auto [before_learner, mapped_before] = allocate_and_measure(kBlock);
  if (mapped_before == 0) {
    std::free(before_learner);
    GTEST_SKIP() << "this process's malloc had slid past 30 MiB already; cannot tell";
  }
  auto ds = test::blobs(32, 2, 4);
  Learner learn(Model(torch::nn::Linear(4, 2)),
                data::DataLoaders(data::DataLoader(ds, data::DataLoaderOptions().batch_size(8)),
                                  data::DataLoader(ds, data::DataLoaderOptions().batch_size(8))),
                cross_entropy(), LearnerOptions().progress(false));
  const auto [after_learner, mapped_after] = allocate_and_measure(kBlock);
  const auto [above_most, mapped_above] = allocate_and_measure(size_t{40} << 20);
  EXPECT_EQ(mapped_after, 0u);     // from the heap now
  EXPECT_GT(mapped_above, 0u);     // above what glibc's sliding reaches: still mapped
  EXPECT_TRUE(settle_malloc_for_training());  // once a process: the Learner's call set them
  for (void* p : {before_learner, after_learner, above_most}) std::free(p);
#endif
}

} // namespace
