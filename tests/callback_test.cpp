// Event order with and without each cancel exception, callback ordering, and
// callbacks replacing batch / pred / loss.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include <functional>
#include <string>
#include <vector>

namespace {

using mixtrain::Callback;
using mixtrain::Event;
using mixtrain::Learner;
using Names = std::vector<std::string>;

/// Records every event name; optionally throws `thrower` at the first `trigger` event.
class EventLog : public Callback {
 public:
  Names events;
  Event trigger = Event::after_fit;
  std::function<void()> thrower;
  bool fired = false;
  void handle(Event e, Learner&) override {
    events.push_back(mixtrain::event_name(e));
    if (thrower && !fired && e == trigger) {
      fired = true;
      thrower();
    }
  }
};

/// 8 training and 4 validation samples, batch size 4: 2 training and 1 validation batch.
Learner tiny_learner() {
  auto train = mixtrain::test::blobs(8, 3, 4, 1);
  auto valid = mixtrain::test::blobs(4, 3, 4, 2);
  mixtrain::data::DataLoaders dls(
      mixtrain::data::DataLoader(train, mixtrain::data::DataLoaderOptions().batch_size(4)),
      mixtrain::data::DataLoader(valid, mixtrain::data::DataLoaderOptions().batch_size(4)));
  return Learner(torch::nn::Linear(4, 3), dls, mixtrain::cross_entropy(), mixtrain::LearnerOptions().progress(false));
}

const Names kTrainBatch = {"before_batch", "after_pred",     "after_loss", "before_backward",
                           "after_backward", "before_step", "after_step", "after_batch"};
const Names kValidBatch = {"before_batch", "after_pred", "after_loss", "after_batch"};

Names concat(std::initializer_list<Names> parts) {
  Names out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

Names run_with_cancel(Event trigger, std::function<void()> thrower) {
  Learner learn = tiny_learner();
  auto log = std::make_shared<EventLog>();
  log->trigger = trigger;
  log->thrower = std::move(thrower);
  learn.add_cb(log);
  learn.fit(1);
  return log->events;
}

class CallbackTest : public mixtrain::test::SeededTest {};

TEST_F(CallbackTest, EventOrderOfAPlainFit) {
  const Names expected = concat({{"before_fit", "before_epoch", "before_train"}, kTrainBatch, kTrainBatch,
                                 {"after_train", "before_validate"}, kValidBatch,
                                 {"after_validate", "after_epoch", "after_fit"}});
  EXPECT_EQ(run_with_cancel(Event::after_fit, nullptr), expected);
}

TEST_F(CallbackTest, CancelBatchSkipsRestOfBatchThenAfterBatch) {
  const Names got = run_with_cancel(Event::after_pred, [] { throw mixtrain::CancelBatchException(); });
  const Names expected = concat({{"before_fit", "before_epoch", "before_train"},
                                 {"before_batch", "after_pred", "after_cancel_batch", "after_batch"}, kTrainBatch,
                                 {"after_train", "before_validate"}, kValidBatch,
                                 {"after_validate", "after_epoch", "after_fit"}});
  EXPECT_EQ(got, expected);
}

TEST_F(CallbackTest, CancelBackwardStillRunsTheStepStage) {
  const Names got = run_with_cancel(Event::before_backward, [] { throw mixtrain::CancelBackwardException(); });
  const Names expected = concat({{"before_fit", "before_epoch", "before_train"},
                                 {"before_batch", "after_pred", "after_loss", "before_backward",
                                  "after_cancel_backward", "after_backward", "before_step", "after_step",
                                  "after_batch"},
                                 kTrainBatch, {"after_train", "before_validate"}, kValidBatch,
                                 {"after_validate", "after_epoch", "after_fit"}});
  EXPECT_EQ(got, expected);
}

TEST_F(CallbackTest, CancelStepSkipsOptimizerStep) {
  Learner learn = tiny_learner();
  // Cancel every step: the weights must not move at all.
  struct CancelAllSteps : Callback {
    void before_step(Learner&) override { throw mixtrain::CancelStepException(); }
  };
  auto log = std::make_shared<EventLog>();
  learn.add_cb(log).add_cb(std::make_shared<CancelAllSteps>());
  const torch::Tensor before = learn.model().module().parameters()[0].clone();
  learn.fit(1);
  EXPECT_TRUE(torch::equal(before, learn.model().module().parameters()[0]));
  const Names cancelled_batch = {"before_batch", "after_pred",  "after_loss",        "before_backward",
                                 "after_backward", "before_step", "after_cancel_step", "after_step",
                                 "after_batch"};
  const Names expected = concat({{"before_fit", "before_epoch", "before_train"}, cancelled_batch, cancelled_batch,
                                 {"after_train", "before_validate"}, kValidBatch,
                                 {"after_validate", "after_epoch", "after_fit"}});
  EXPECT_EQ(log->events, expected);
}

TEST_F(CallbackTest, CancelTrainEndsTrainingPhaseButValidates) {
  const Names got = run_with_cancel(Event::before_batch, [] { throw mixtrain::CancelTrainException(); });
  const Names expected = concat({{"before_fit", "before_epoch", "before_train", "before_batch",
                                  "after_cancel_train", "after_train", "before_validate"},
                                 kValidBatch, {"after_validate", "after_epoch", "after_fit"}});
  EXPECT_EQ(got, expected);
}

TEST_F(CallbackTest, CancelValidateSkipsValidation) {
  const Names got = run_with_cancel(Event::before_validate, [] { throw mixtrain::CancelValidateException(); });
  const Names expected = concat({{"before_fit", "before_epoch", "before_train"}, kTrainBatch, kTrainBatch,
                                 {"after_train", "before_validate", "after_cancel_validate", "after_validate",
                                  "after_epoch", "after_fit"}});
  EXPECT_EQ(got, expected);
}

TEST_F(CallbackTest, CancelEpochSkipsValidationAndGoesToAfterEpoch) {
  const Names got = run_with_cancel(Event::after_train, [] { throw mixtrain::CancelEpochException(); });
  const Names expected = concat({{"before_fit", "before_epoch", "before_train"}, kTrainBatch, kTrainBatch,
                                 {"after_train", "after_cancel_epoch", "after_epoch", "after_fit"}});
  EXPECT_EQ(got, expected);
}

TEST_F(CallbackTest, CancelFitEndsEverything) {
  const Names got = run_with_cancel(Event::before_epoch, [] { throw mixtrain::CancelFitException(); });
  EXPECT_EQ(got, (Names{"before_fit", "before_epoch", "after_cancel_fit", "after_fit"}));
}

TEST_F(CallbackTest, OtherExceptionsPropagate) {
  Learner learn = tiny_learner();
  auto log = std::make_shared<EventLog>();
  log->trigger = Event::after_loss;
  log->thrower = [] { throw std::runtime_error("boom"); };
  learn.add_cb(log);
  EXPECT_THROW_WITH(learn.fit(1), "boom");
}

TEST_F(CallbackTest, CallbacksRunInOrderThenInsertionOrder) {
  Learner learn = tiny_learner();
  Names seen;
  struct Named : Callback {
    std::string tag;
    Names* seen;
    Named(std::string t, int o, Names* s) : tag(std::move(t)), seen(s) { order = o; }
    void before_fit(Learner&) override { seen->push_back(tag); }
  };
  auto c = std::make_shared<Named>("c", 10, &seen);
  learn.add_cb(c);
  learn.add_cb(std::make_shared<Named>("a", -5, &seen));
  learn.add_cb(std::make_shared<Named>("d", 10, &seen));
  learn.add_cb(std::make_shared<Named>("b", 0, &seen));
  learn.fit(1);
  EXPECT_EQ(seen, (Names{"a", "b", "c", "d"}));
  seen.clear();
  learn.remove_cb(c);
  learn.fit(1);
  EXPECT_EQ(seen, (Names{"a", "b", "d"}));
  EXPECT_NE(learn.get_cb<mixtrain::Recorder>(), nullptr);
}

TEST_F(CallbackTest, FitOnlyCallbacksAreDetachedAfterFit) {
  Learner learn = tiny_learner();
  const size_t before = learn.cbs().size();
  auto log = std::make_shared<EventLog>();
  learn.fit(1, 1e-3, {log});
  EXPECT_FALSE(log->events.empty());
  EXPECT_EQ(learn.cbs().size(), before);
}

TEST_F(CallbackTest, CallbacksCanReplaceBatchPredAndLoss) {
  Learner learn = tiny_learner();
  struct Replace : Callback {
    std::vector<double> logged;
    void before_batch(Learner& l) override { l.batch().x = torch::zeros_like(l.batch().x); }
    void after_pred(Learner& l) override {
      // With zero inputs the linear layer outputs its bias; overwrite with zeros:
      // cross-entropy of all-zero logits over 3 classes is exactly log(3).
      l.pred() = l.pred() * 0;
    }
    void after_loss(Learner& l) override { logged.push_back(l.loss().item<double>()); }
  };
  auto replace = std::make_shared<Replace>();
  learn.add_cb(replace);
  learn.fit(1);
  ASSERT_EQ(replace->logged.size(), 3u);  // 2 train + 1 valid batch
  for (double v : replace->logged) EXPECT_NEAR(v, std::log(3.0), 1e-6);
  EXPECT_NEAR(learn.recorder().values().back().valid_loss, std::log(3.0), 1e-6);

  // Replacing the loss in after_loss changes what the Recorder logs.
  struct Override : Callback {
    void after_loss(Learner& l) override { l.loss() = torch::tensor(7.0); }
  };
  Learner learn2 = tiny_learner();
  learn2.add_cb(std::make_shared<Override>());
  learn2.fit(1);
  EXPECT_DOUBLE_EQ(learn2.recorder().steps().back().loss, 7.0);
}

// A NaN/inf loss shows in its own step and does not stay in the smoothed loss for the
// rest of the run (every later epoch's train_loss was inf); a branch (train --from in
// another precision) starts the smoothing and the skip count again, and both survive a
// checkpoint.
TEST(RecorderRowsTest, ANonFiniteLossAndABranchStartTheSmoothedLossAgain) {
  using namespace mixtrain;
  auto dls = data::DataLoaders::from_split({test::blobs(64), test::blobs(32)}, 16, 1);  // 4 steps an epoch
  Learner learn(torch::nn::Linear(4, 3), dls, cross_entropy(), LearnerOptions().progress(false));
  struct InfAtStep : Callback {
    InfAtStep() { order = 40; }  // before the Recorder
    void after_loss(Learner& l) override {
      // inf as the value, the real loss's gradient: the weights stay finite.
      if (l.training() && l.train_iter() == 1) l.loss() = l.loss() + (torch::tensor(INFINITY) - l.loss()).detach();
    }
  };
  learn.fit(2, 1e-2, {std::make_shared<InfAtStep>()});
  const auto& steps = learn.recorder().steps();
  ASSERT_EQ(steps.size(), 8u);
  EXPECT_TRUE(std::isinf(steps[1].smooth_loss));
  EXPECT_DOUBLE_EQ(steps[2].smooth_loss, steps[2].loss);  // the smoothing starts again (debiased: the loss itself)
  for (size_t i = 2; i < steps.size(); ++i) EXPECT_TRUE(std::isfinite(steps[i].smooth_loss)) << i;
  for (const auto& e : learn.recorder().values()) EXPECT_TRUE(std::isfinite(e.train_loss)) << e.epoch;
  EXPECT_EQ(learn.recorder().branch_step(), 0);

  learn.recorder().start_branch();
  const std::string saved = learn.save_to_memory();
  learn.fit(1, 1e-2);
  EXPECT_EQ(learn.recorder().branch_step(), 8);
  EXPECT_DOUBLE_EQ(learn.recorder().steps()[8].smooth_loss, learn.recorder().steps()[8].loss);
  EXPECT_EQ(learn.recorder().own_skipped_steps(), 0);
  learn.load_from_memory(saved.data(), saved.size());
  EXPECT_EQ(learn.recorder().branch_step(), 8) << "the branch step did not survive the checkpoint";
}

} // namespace

namespace {

using namespace mixtrain;

// Rows of epochs that ran are never lost: a fit cancelled in after_epoch by a
// callback that runs before the Recorder, an interrupted fit's steps, and a
// second fit's rows (numbered on, not from 0 again).
TEST(RecorderRowsTest, EpochsThatRanAlwaysGetTheirRows) {
  const std::string dir = test::scratch_dir("rows_kept") + "/not/yet/made";  // the logger makes it
  auto dls = data::DataLoaders::from_split({test::blobs(64), test::blobs(32)}, 16, 1);
  Learner learn(torch::nn::Linear(4, 3), dls, cross_entropy(), LearnerOptions().progress(false).metrics({accuracy()}));
  struct StopAfterFirstEpoch : Callback {
    StopAfterFirstEpoch() { order = 40; }  // before the Recorder (50)
    void after_epoch(Learner&) override { throw CancelFitException(); }
  };
  std::ostringstream table;
  learn.add_cb(std::make_shared<callbacks::CSVLogger>(dir));
  learn.add_cb(std::make_shared<callbacks::ProgressCallback>(table, false));
  learn.fit(3, 1e-2, {std::make_shared<StopAfterFirstEpoch>()});
  EXPECT_EQ(learn.recorder().values().size(), 1u);
  EXPECT_NE(table.str().find("\n0 "), std::string::npos) << table.str();

  // An interrupted fit (cancelled mid-epoch) still writes the steps it did.
  struct StopAtStep : Callback {
    StopAtStep() { order = 95; }  // after the Recorder, as the Checkpointer's interrupt
    void after_batch(Learner& l) override {
      if (l.training() && l.train_iter() == 2) throw CancelFitException();
    }
  };
  learn.fit(2, 1e-2, {std::make_shared<StopAtStep>()});
  learn.fit(1, 1e-2);  // a second complete fit: its row is epoch 1 in metrics.csv
  std::ifstream metrics(dir + "/metrics.csv"), steps(dir + "/steps.csv");
  std::vector<std::string> mrows, srows;
  for (std::string line; std::getline(metrics, line);) mrows.push_back(line);
  for (std::string line; std::getline(steps, line);) srows.push_back(line);
  ASSERT_EQ(mrows.size(), 3u);  // header, the cancelled fit's epoch, the last fit's epoch
  EXPECT_EQ(mrows[1].rfind("0,", 0), 0u);
  EXPECT_EQ(mrows[2].rfind("1,", 0), 0u);
  EXPECT_EQ(srows.size(), 1u + 4 + 2 + 4);  // 4 steps, then the 2 of the interrupted fit, then 4
}

} // namespace

namespace {

// The live bar and the table number epochs the same way (from 0, as fastai's table).
TEST(ProgressNumberingTest, TheLiveBarAndTheTableNumberEpochsAlike) {
  auto dls = mixtrain::data::DataLoaders::from_split({test::blobs(64), test::blobs(32)}, 16, 1);
  mixtrain::Learner learn(torch::nn::Linear(4, 3), dls, mixtrain::cross_entropy(),
                          mixtrain::LearnerOptions().progress(false));
  std::ostringstream out;
  learn.add_cb(std::make_shared<mixtrain::callbacks::ProgressCallback>(out, /*live=*/true));
  struct Slow : mixtrain::Callback {  // slower than the bar's 0.1 s redraw interval, so it is drawn
    void after_batch(mixtrain::Learner&) override { std::this_thread::sleep_for(std::chrono::milliseconds(120)); }
  };
  learn.add_cb(std::make_shared<Slow>());
  learn.fit(1, 1e-2);
  EXPECT_NE(out.str().find("epoch 0 (of 1)"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("epoch 1/1"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("\033[K0 "), std::string::npos) << out.str();  // the table's row: epoch 0
}

// `mixtrain --help` lists every subcommand; `doctor --help` lists only the flags doctor takes.
TEST(ProgressNumberingTest, HelpListsLaunchAndDoctorOnlyItsOwnFlags) {
  const std::string tmp = std::string(MIXTRAIN_TEST_TMP) + "/help.out";
  std::filesystem::create_directories(MIXTRAIN_TEST_TMP);
  ASSERT_EQ(std::system((std::string(MIXTRAIN_CLI_PATH) + " --help >" + tmp + " 2>&1").c_str()), 0);
  std::ifstream f(tmp);
  const std::string help((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* cmd : {"train", "doctor", "launch"}) EXPECT_NE(help.find(cmd), std::string::npos) << cmd;
  ASSERT_EQ(std::system((std::string(MIXTRAIN_CLI_PATH) + " doctor --help >" + tmp + " 2>&1").c_str()), 0);
  std::ifstream g(tmp);
  const std::string doctor((std::istreambuf_iterator<char>(g)), std::istreambuf_iterator<char>());
  for (const char* train_only : {"--resume", "--save-every", "--comm-dtype", "--keep N", "--force", "--loss-scale"})
    EXPECT_EQ(doctor.find(train_only), std::string::npos) << train_only;
  EXPECT_NE(doctor.find("diagnosis.json, loss.svg and scale.svg"), std::string::npos);
}

} // namespace
