// At most one device-to-host read per training step, in every precision mode,
// counted at the dispatcher: every _local_scalar_dense (item(), is_nonzero, ...)
// and every explicit copy to the CPU made while a training batch runs. On a GPU
// each one stalls the pipeline; here the same code paths run on the CPU.
#include "cli_util.h"
#include "test_util.h"

#include <mixtrain/amp/op_trace.h>
#include <mixtrain/callbacks/summary_writer.h>
#include <mixtrain/callbacks/terminate_on_nan.h>
#include <mixtrain/compat.h>
#include <mixtrain/util/host_read.h>
#include <mixtrain/mixtrain.h>
#include <nlohmann/json.hpp>

namespace {

using namespace mixtrain;

using test::reads_host;

/// Counts the reads the dispatcher sees while `counting` is set.
class HostReadCounter : public amp::OpObserver {
 public:
  void on_op(const std::string& name, c10::ArrayRef<c10::IValue> inputs, c10::ArrayRef<c10::IValue>,
             c10::ArrayRef<c10::IValue>, bool) override {
    if (counting && reads_host(name, inputs)) {
      ++reads;
      names.push_back(name);
    }
  }
  bool counting = false;
  int64_t reads = 0;
  std::vector<std::string> names;  // what read, for the failure message
};

/// Opens the count before every other callback's before_batch ...
class StartCounting : public Callback {
 public:
  explicit StartCounting(HostReadCounter* c) : c_(c) { order = -1000; }
  void before_batch(Learner& learn) override {
    c_->reads = 0;
    c_->names.clear();
    c_->counting = learn.training();
  }

 private:
  HostReadCounter* c_;
};

/// ... and closes it after every other callback's after_batch.
class StopCounting : public Callback {
 public:
  explicit StopCounting(HostReadCounter* c) : c_(c) { order = 1000; }
  void after_batch(Learner& learn) override {
    if (c_->counting) {
      per_step.push_back(c_->reads);
      std::string who;
      for (const auto& n : c_->names) who += n + " ";
      readers.push_back(who);
    }
    c_->counting = false;
  }
  std::vector<int64_t> per_step;
  std::vector<std::string> readers;

 private:
  HostReadCounter* c_;
};

class HostReadsTest : public test::SeededTest {};

TEST_F(HostReadsTest, EveryPrecisionModeReadsTheHostOncePerTrainingStep) {
  const data::Dataset train = test::blobs(256, 3, 4, 1), valid = test::blobs(64, 3, 4, 2);
  // On a GPU (scripts/gpu-check.sh runs this test there) the same count on CUDA tensors, where each read is a stall.
  std::vector<torch::Device> devices{torch::kCPU};
  if (compat::cuda_available()) devices.emplace_back(torch::kCUDA);
  for (const torch::Device device : devices)
  for (const Precision precision : {Precision::kFp32, Precision::kFp16, Precision::kBf16, Precision::kBf16Master}) {
    if (device.is_cpu() == false && precision == Precision::kBf16 && !compat::cuda_bf16_supported()) continue;
    SCOPED_TRACE(std::string(precision_name(precision)) + " on " + device.str());
    const std::string dir = test::scratch_dir(std::string("host_reads_") + precision_name(precision) + "_" + device.str());
    auto net = torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
    Learner learn(net, data::DataLoaders::from_split({train, valid}, 32, 0), cross_entropy(),
                  LearnerOptions().metrics({accuracy()}).device(device));  // the progress output too, as the CLI shows it
    learn.set_precision(precision);
    // The run's own readers of the loss: the NaN stop and summary.json, as run::train adds them.
    learn.add_cb(std::make_shared<callbacks::TerminateOnNaN>(10));
    learn.add_cb(std::make_shared<callbacks::SummaryWriter>(callbacks::SummaryWriterOptions(dir + "/summary.json")));
    HostReadCounter counter;
    auto start = std::make_shared<StartCounting>(&counter);
    auto stop = std::make_shared<StopCounting>(&counter);
    learn.add_cb(start);
    learn.add_cb(stop);
    {
      const amp::OpTraceScope observe(&counter);
      learn.fit_one_cycle(2, 1e-2);
    }
    ASSERT_EQ(stop->per_step.size(), 2u * (256 / 32));
    for (size_t i = 0; i < stop->per_step.size(); ++i)
      EXPECT_EQ(stop->per_step[i], 1) << "step " << i << ": " << stop->readers[i];
    // summary.json counts the reads through mixtrain/host_read.h: the same one per step.
    const auto summary = nlohmann::json::parse(test::slurp(dir + "/summary.json"));
    EXPECT_EQ(summary.at("host_reads_per_step").get<double>(), 1.0);
    EXPECT_TRUE(std::isfinite(learn.recorder().steps().back().loss));
  }
}

// The loss is read once per batch however many callbacks ask, and again only
// when a callback replaced it.
TEST_F(HostReadsTest, TheLossValueIsReadOnceAndFollowsAReplacedLoss) {
  class AskThrice : public Callback {
   public:
    void after_loss(Learner& learn) override {
      const int64_t before = host_reads();
      const double a = learn.loss_value(), b = learn.loss_value();
      EXPECT_EQ(a, b);
      reads_for_two = host_reads() - before;
      learn.loss() = learn.loss() * 0 + 7;  // a callback may replace the loss
      replaced = learn.loss_value();
      // Released first, then made anew: the new loss may sit where the old one was freed
      // (malloc hands the same block back), and must still be read, not taken for the old.
      learn.loss() = torch::Tensor();
      learn.loss() = torch::full({}, 9.0);
      remade = learn.loss_value();
    }
    int64_t reads_for_two = -1;
    double replaced = 0, remade = 0;
  };
  auto ask = std::make_shared<AskThrice>();
  const data::Dataset train = test::blobs(64, 3, 4, 1);
  Learner learn(torch::nn::Linear(4, 3), data::DataLoaders::from_split({train, train}, 32, 0), cross_entropy(),
                LearnerOptions().progress(false));
  learn.add_cb(ask);
  learn.fit(1, 1e-3);
  EXPECT_EQ(ask->reads_for_two, 1);
  EXPECT_EQ(ask->replaced, 7.0);
  EXPECT_EQ(ask->remade, 9.0);
  EXPECT_EQ(read_to_host({torch::tensor(2.5), torch::tensor(true), torch::tensor(int64_t{3})}),
            (std::vector<double>{2.5, 1.0, 3.0}));
}

} // namespace
