// SaveModel and EarlyStopping (fastai's TrackerCallbacks) on scripted metric sequences.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;

/// A metric whose value per epoch is scripted: epoch i validates to values[i].
struct ScriptedMetric : Callback {
  explicit ScriptedMetric(std::vector<double> v) : values(std::move(v)) { order = -1; }
  void before_validate(Learner& learn) override { current = values.at(static_cast<size_t>(learn.epoch())); }
  Metric metric() {
    return {"score", [this](const torch::Tensor& p, const torch::Tensor&) { return torch::full({}, current); }};
  }
  std::vector<double> values;
  double current = 0;
};

/// The model's weights after each epoch.
struct WeightsPerEpoch : Callback {
  void after_epoch(Learner& learn) override {
    std::vector<torch::Tensor> s;
    for (const auto& t : learn.model().state_tensors()) s.push_back(t.clone());
    states.push_back(s);
  }
  std::vector<std::vector<torch::Tensor>> states;
};

class TrackerTest : public test::SeededTest {
 protected:
  std::unique_ptr<Learner> make(const std::shared_ptr<ScriptedMetric>& scripted) {
    torch::manual_seed(0);
    auto learn = std::make_unique<Learner>(
        torch::nn::Linear(4, 3),
        data::DataLoaders::from_split({test::blobs(128, 3, 4, 31), test::blobs(64, 3, 4, 32)}, 32, 1), cross_entropy(),
        LearnerOptions().progress(false).metrics({scripted->metric()}));
    learn->add_cb(scripted);
    return learn;
  }
};

TEST_F(TrackerTest, EarlyStoppingStopsOncePatienceEpochsBroughtNothing) {
  auto scripted = std::make_shared<ScriptedMetric>(std::vector<double>{0.1, 0.3, 0.2, 0.25, 0.1, 0.5, 0.6});
  auto learn = make(scripted);
  auto stop = std::make_shared<callbacks::EarlyStopping>("score", 0, /*patience=*/2);
  learn->add_cb(stop);
  learn->fit(7, 1e-3);
  // Best at epoch 1 (0.3); epochs 2 and 3 bring nothing: stop after epoch 3.
  EXPECT_TRUE(stop->stopped());
  EXPECT_EQ(stop->stopped_epoch(), 3);
  EXPECT_EQ(learn->recorder().values().size(), 4u);
  EXPECT_FLOAT_EQ(stop->best(), 0.3);  // a float metric
  // With min_delta, an epoch has to beat the best by more than it.
  auto strict = make(std::make_shared<ScriptedMetric>(std::vector<double>{0.1, 0.15, 0.18, 0.5}));
  auto stop2 = std::make_shared<callbacks::EarlyStopping>("score", 0.1, 1);
  strict->add_cb(stop2);
  strict->fit(4, 1e-3);
  EXPECT_EQ(stop2->stopped_epoch(), 1);  // 0.15 does not beat 0.1 by more than 0.1
  EXPECT_THROW_WITH(callbacks::EarlyStopping("valid_loss", 0, -1), "Invalid patience: -1");
}

TEST_F(TrackerTest, SaveModelRestoresTheBestEpochsWeights) {
  auto scripted = std::make_shared<ScriptedMetric>(std::vector<double>{0.2, 0.9, 0.4, 0.5});
  auto learn = make(scripted);
  auto weights = std::make_shared<WeightsPerEpoch>();
  auto keep = std::make_shared<callbacks::SaveModel>("score");
  learn->add_cb(weights);
  learn->add_cb(keep);
  learn->fit(4, 1e-2);
  ASSERT_EQ(weights->states.size(), 4u);
  EXPECT_EQ(keep->best_epoch(), 1);
  test::expect_bitwise_equal(learn->model().state_tensors(), weights->states[1]);
  EXPECT_FALSE(torch::equal(weights->states[1][0], weights->states[3][0]));  // training moved on after epoch 1
}

TEST_F(TrackerTest, AnUnknownMonitorNamesTheChoicesAndTheStateIsInCheckpoints) {
  auto learn = make(std::make_shared<ScriptedMetric>(std::vector<double>{0.2, 0.9}));
  learn->add_cb(std::make_shared<callbacks::SaveModel>("acuracy"));
  EXPECT_THROW_WITH(learn->fit(1, 1e-3), "Unknown monitored value 'acuracy' (choices: train_loss, valid_loss, score)");

  auto scripted = std::make_shared<ScriptedMetric>(std::vector<double>{0.2, 0.9, 0.1});
  auto a = make(scripted);
  auto keep = std::make_shared<callbacks::SaveModel>("score");
  a->add_cb(keep);
  a->fit(2, 1e-2);
  const std::string path = test::scratch_dir("tracker") + "/c.pt";
  a->save(path);
  auto b = make(scripted);
  auto keep_b = std::make_shared<callbacks::SaveModel>("score");
  b->add_cb(keep_b);
  b->load(path);
  EXPECT_FLOAT_EQ(keep_b->best(), 0.9);
  EXPECT_EQ(keep_b->best_epoch(), 1);
  test::expect_bitwise_equal(keep_b->best_state(), keep->best_state());
}

} // namespace
