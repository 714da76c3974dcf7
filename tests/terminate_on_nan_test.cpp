// TerminateOnNaN: fp32 stops at the first non-finite loss with the last good
// state saved; with loss scaling only a run of bad steps stops the fit.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;
namespace nn = torch::nn;

data::DataLoaders nan_stop_loaders(double input_scale = 1.0) {
  auto train = test::blobs(128, 3, 4, 51), valid = test::blobs(32, 3, 4, 52);
  train.x = train.x * input_scale;
  valid.x = valid.x * input_scale;
  return data::DataLoaders::from_split({train, valid}, 16, 1);
}

class TerminateOnNaNTest : public test::SeededTest {};

TEST_F(TerminateOnNaNTest, Fp32StopsAtTheFirstBadLossAndKeepsTheLastGoodState) {
  const std::string dir = test::scratch_dir("nan_fp32");
  Learner learn(nn::Linear(4, 3), nan_stop_loaders(), cross_entropy(), LearnerOptions().progress(false).opt_func(sgd(0.0)));
  auto ckpt = std::make_shared<callbacks::Checkpointer>(callbacks::CheckpointerOptions(dir));
  auto stop = std::make_shared<callbacks::TerminateOnNaN>(10, ckpt);
  // Poison the weights after step 2: the next forward pass gives a NaN loss.
  struct Poison : Callback {
    void after_batch(Learner& l) override {
      if (l.training() && l.train_iter() == 3) {
        torch::NoGradGuard g;
        l.model().module().parameters()[0].fill_(NAN);
      }
    }
  };
  learn.add_cb(stop).add_cb(std::make_shared<Poison>());
  learn.fit(2, 1e-2);
  ASSERT_TRUE(stop->triggered());
  EXPECT_NE(stop->message().find("the loss became NaN at step 3"), std::string::npos) << stop->message();
  // The poisoned weights are not called good: the message says what was saved.
  EXPECT_EQ(stop->message().find("last good state"), std::string::npos) << stop->message();
  EXPECT_NE(stop->message().find("the weights are already non-finite"), std::string::npos) << stop->message();
  EXPECT_NE(stop->message().find("for inspection only, to " + dir + "/checkpoint-3.pt"), std::string::npos);
  EXPECT_EQ(learn.recorder().steps().size(), 3u);  // the bad batch never stepped
}

// A NaN from the data (finite weights): the saved state is the last good one, and
// every parameter of the checkpoint is the one the bad batch started from.
TEST_F(TerminateOnNaNTest, ANanFromTheDataSavesTheLastGoodWeights) {
  const std::string dir = test::scratch_dir("nan_data");
  auto train = test::blobs(128, 3, 4, 51), valid = test::blobs(32, 3, 4, 52);
  train.x[40][0] = NAN;  // sample 40 is in the third batch of 16 (no shuffling below)
  data::DataLoaders dls(data::DataLoader(train, data::DataLoaderOptions().batch_size(16)),
                        data::DataLoader(valid, data::DataLoaderOptions().batch_size(16)));
  Learner learn(nn::Linear(4, 3), dls, cross_entropy(), LearnerOptions().progress(false));
  auto ckpt = std::make_shared<callbacks::Checkpointer>(callbacks::CheckpointerOptions(dir));
  auto stop = std::make_shared<callbacks::TerminateOnNaN>(10, ckpt);
  learn.add_cb(stop);
  learn.fit(1, 1e-2);
  ASSERT_TRUE(stop->triggered());
  EXPECT_NE(stop->message().find("last good state saved to " + dir + "/checkpoint-2.pt"), std::string::npos)
      << stop->message();
  Learner reader(nn::Linear(4, 3), dls, cross_entropy(), LearnerOptions().progress(false));
  reader.add_cb(std::make_shared<callbacks::TerminateOnNaN>());
  reader.load(dir + "/checkpoint-2.pt");
  test::expect_bitwise_equal(reader.model().state_tensors(), learn.model().state_tensors());
  for (const auto& t : reader.model().state_tensors()) EXPECT_TRUE(torch::isfinite(t).all().item<bool>());
}

TEST_F(TerminateOnNaNTest, WithLossScalingOnlyARunOfBadStepsStops) {
  // Activations of ~1e6 overflow in (emulated) fp16 on every batch: NaN loss each step.
  nn::Linear big(4, 3);
  {
    torch::NoGradGuard g;
    big->weight.fill_(1e4);
  }
  Learner learn(big, nan_stop_loaders(100.0), cross_entropy(), LearnerOptions().progress(false));
  learn.to_fp16();
  auto stop = std::make_shared<callbacks::TerminateOnNaN>(3);
  learn.add_cb(stop);
  const torch::Tensor before = big->weight.detach().clone();
  learn.fit(1, 1e-2);
  ASSERT_TRUE(stop->triggered());
  EXPECT_NE(stop->message().find("NaN/inf for 4 consecutive steps despite loss scaling"), std::string::npos)
      << stop->message();
  EXPECT_NE(stop->message().find("no checkpoint written"), std::string::npos);
  ASSERT_EQ(learn.recorder().steps().size(), 3u);  // three tolerated, each skipped by the scaler
  for (const auto& s : learn.recorder().steps()) EXPECT_TRUE(s.skipped);
  EXPECT_TRUE(torch::equal(big->weight, before));

  // A healthy fp32 run never triggers it.
  Learner plain(nn::Linear(4, 3), nan_stop_loaders(), cross_entropy(), LearnerOptions().progress(false));
  auto quiet = std::make_shared<callbacks::TerminateOnNaN>(3);
  plain.add_cb(quiet);
  plain.fit(1, 1e-2);
  EXPECT_FALSE(quiet->triggered());
  EXPECT_THROW_WITH(callbacks::TerminateOnNaN(-1), "Invalid max_bad_steps");
}

} // namespace
