// The overflow tracer: the first fp16 op that overflows, named by op and module
// path, at-risk ops, fp32-only NaNs, and no side effects on the model.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;
namespace nn = torch::nn;

/// A user block with holder members, nested inside a Sequential: body.2.fc1.
struct BlockImpl : nn::Module {
  BlockImpl() : fc1(register_module("fc1", nn::Linear(8, 8))), fc2(register_module("fc2", nn::Linear(8, 8))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct NetImpl : nn::Module {
  NetImpl() {
    body = register_module("body", nn::Sequential(nn::Linear(4, 8), nn::ReLU(), Block()));
    head = register_module("head", nn::Linear(8, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return head(body->forward(x)); }
  nn::Sequential body{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

nn::Linear fc1_of(Net& net) { return net->body[2]->as<BlockImpl>()->fc1; }

std::unique_ptr<Learner> learner_for(Net net) {
  auto ds = test::blobs(64, 3, 4);
  auto dls = data::DataLoaders(data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)),
                               data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)));
  return std::make_unique<Learner>(Model(net), std::move(dls), cross_entropy(), LearnerOptions().progress(false));
}

data::Batch first_batch(Learner& learn) { return {learn.dls().train.dataset().x.slice(0, 0, 16), learn.dls().train.dataset().y.slice(0, 0, 16)}; }

class OverflowTraceTest : public test::SeededTest {};

TEST_F(OverflowTraceTest, NamesTheFirstOverflowingLayerByModulePath) {
  Net net;
  {
    torch::NoGradGuard g;
    fc1_of(net)->weight.mul_(1e5);  // fc1's outputs reach ~1e5 > 65504
  }
  auto learn = learner_for(net);
  const data::Batch b = first_batch(*learn);
  // The largest fc1 output in fp32, which the tracer must report (measured before rounding to half).
  torch::Tensor h = net->body[0]->as<nn::LinearImpl>()->forward(b.x).relu();
  const double expected = fc1_of(net)->forward(h).abs().max().item<double>();
  ASSERT_GT(expected, diagnose::kFp16Max);

  const diagnose::OverflowTrace t = diagnose::trace_overflow(*learn, b);
  ASSERT_TRUE(t.first_overflow.has_value());
  EXPECT_EQ(t.first_overflow->op, "aten::addmm");  // what libtorch's Linear runs (linear is decomposed above us)
  EXPECT_EQ(t.first_overflow->module, "body.2.fc1");
  // Its inputs and weights were rounded to half first (2^-11 relative each), the output not yet.
  EXPECT_NEAR(t.first_overflow->max_abs, expected, expected * 2e-3);
  EXPECT_EQ(t.first_overflow->where(), "body.2.fc1 (aten::addmm)");
  EXPECT_FALSE(t.input_nonfinite);
  EXPECT_FALSE(std::isfinite(t.loss));  // the inf propagated to the loss, as on a GPU
}

TEST_F(OverflowTraceTest, HealthyModelHasNoOverflowAndAtRiskOpsAreListed) {
  Net net;
  auto learn = learner_for(net);
  const data::Batch b = first_batch(*learn);
  diagnose::OverflowTrace t = diagnose::trace_overflow(*learn, b);
  EXPECT_FALSE(t.first_overflow.has_value());
  EXPECT_TRUE(t.at_risk.empty());
  EXPECT_GT(t.ops_traced, 5);
  EXPECT_TRUE(std::isfinite(t.loss));

  {
    torch::NoGradGuard g;
    net->head->weight.mul_(1e5);  // logits around 2^14..2^16: close to the edge, not over
  }
  t = diagnose::trace_overflow(*learn, b);
  const double head_max = net->head->forward(net->body->forward(b.x)).abs().max().item<double>();
  ASSERT_GT(head_max, diagnose::kAtRiskMagnitude);
  ASSERT_LT(head_max, diagnose::kFp16Max);
  EXPECT_FALSE(t.first_overflow.has_value());
  ASSERT_FALSE(t.at_risk.empty());
  EXPECT_EQ(t.at_risk.front().module, "head");
}

/// y = fc(x) + fc(x): the add of two fp16 activations overflows although each is finite.
struct ResidualImpl : nn::Module {
  ResidualImpl() : fc(register_module("fc", nn::Linear(4, 4))) {}
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = fc(x);
    return h + h;
  }
  nn::Linear fc;
};
TORCH_MODULE(Residual);

TEST_F(OverflowTraceTest, ElementwiseOpsFedByFp16OpsAreTracedToo) {
  Residual net;
  {
    torch::NoGradGuard g;
    net->fc->weight.fill_(0);
    net->fc->bias.fill_(40000);  // each output 40000 (fp16-representable), the sum 80000 is not
  }
  auto ds = test::blobs(16, 3, 4);
  auto dls = data::DataLoaders(data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)),
                               data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)));
  Learner learn(Model(net), std::move(dls), cross_entropy(), LearnerOptions().progress(false));
  const diagnose::OverflowTrace t = diagnose::trace_overflow(learn, {ds.x, ds.y});
  ASSERT_TRUE(t.first_overflow.has_value());
  EXPECT_EQ(t.first_overflow->op, "aten::add");
  EXPECT_EQ(t.first_overflow->after_module, "fc");
  EXPECT_NEAR(t.first_overflow->max_abs, 80000, 1);
  ASSERT_FALSE(t.at_risk.empty());  // the linear itself (40000) is at risk
  EXPECT_EQ(t.at_risk.front().where(), "fc (aten::addmm)");
}

/// Features scaled past fp16's range before an RNN, as an Embedding with huge weights
/// feeds one: fp32 until the RNN, which a GPU runs in fp16 (cuDNN's _cudnn_rnn).
template <typename Rnn, typename RnnOptions>
struct RecurrentNetImpl : nn::Module {
  RecurrentNetImpl()
      : rnn(register_module("rnn", Rnn(RnnOptions(4, 8).batch_first(true)))),
        head(register_module("head", nn::Linear(8, 3))) {}
  torch::Tensor forward(torch::Tensor x) {
    const torch::Tensor out = std::get<0>(rnn->forward(x.unsqueeze(1).expand({-1, 3, -1}) * 1e5));
    return head(out.select(1, -1));
  }
  Rnn rnn;
  nn::Linear head;
};

template <typename Rnn, typename RnnOptions>
void expect_rnn_overflow_located(const std::string& op) {
  SCOPED_TRACE(op);
  auto net = std::make_shared<RecurrentNetImpl<Rnn, RnnOptions>>();
  auto ds = test::blobs(16, 3, 4);
  auto dls = data::DataLoaders(data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)),
                               data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)));
  Learner learn(Model(nn::ModuleHolder<RecurrentNetImpl<Rnn, RnnOptions>>(net)), std::move(dls), cross_entropy(),
                LearnerOptions().progress(false));
  const diagnose::OverflowTrace t = diagnose::trace_overflow(learn, {ds.x, ds.y});
  ASSERT_TRUE(t.first_overflow.has_value()) << (t.first_fp32_nonfinite ? t.first_fp32_nonfinite->where() : "");
  EXPECT_EQ(t.first_overflow->where(), "rnn (" + op + ")");
  EXPECT_TRUE(t.first_overflow->fp16);
  EXPECT_FALSE(t.first_fp32_nonfinite.has_value());

  // In range, the RNN's outputs are fp16 results: half values, marked so, as cuDNN's are.
  amp::ReducedPrecisionEmulation emulation;
  const torch::Tensor out = std::get<0>(net->rnn->forward(torch::randn({2, 3, 4})));
  EXPECT_TRUE(amp::holds_reduced_result(out));
  EXPECT_TRUE(torch::equal(out, out.to(torch::kHalf).to(torch::kFloat)));
}

TEST_F(OverflowTraceTest, AnRnnIsOneFp16OpAsCudnnRunsItOnAGpu) {
  expect_rnn_overflow_located<nn::LSTM, nn::LSTMOptions>("aten::lstm");
  expect_rnn_overflow_located<nn::GRU, nn::GRUOptions>("aten::gru");
}

// Causal attention masks the future with -inf on purpose (masked_fill on fp16 logits):
// the built-in transformer must not be reported as overflowing.
TEST_F(OverflowTraceTest, MaskingWithMinusInfinityIsNotAnOverflow) {
  torch::manual_seed(0);
  models::TransformerLM lm;
  data::Dataset ds{torch::randint(0, 256, {8, 64}), torch::randint(0, 256, {8, 64})};
  auto dls = data::DataLoaders(data::DataLoader(ds, data::DataLoaderOptions().batch_size(8)),
                               data::DataLoader(ds, data::DataLoaderOptions().batch_size(8)));
  Learner learn(lm, std::move(dls), cross_entropy(), LearnerOptions().progress(false));
  const diagnose::OverflowTrace t = diagnose::trace_overflow(learn, {ds.x, ds.y});
  EXPECT_FALSE(t.first_overflow.has_value()) << t.first_overflow->where();
  EXPECT_FALSE(t.first_fp32_nonfinite.has_value());
  EXPECT_TRUE(std::isfinite(t.loss));
}

TEST_F(OverflowTraceTest, NanInputsAreReportedAsInputsNotAsAnOp) {
  Net net;
  auto learn = learner_for(net);
  data::Batch b = first_batch(*learn);
  b.x = b.x.clone();
  b.x[0][0] = NAN;
  const diagnose::OverflowTrace t = diagnose::trace_overflow(*learn, b);
  EXPECT_TRUE(t.input_nonfinite);
  EXPECT_FALSE(t.first_overflow.has_value());  // NaN in, NaN out: no op made it
}

TEST_F(OverflowTraceTest, LeavesBatchNormStatisticsAndModeAlone) {
  nn::Sequential net(nn::Linear(4, 8), nn::BatchNorm1d(8), nn::ReLU(), nn::Linear(8, 3));
  auto ds = test::blobs(32, 3, 4);
  auto dls = data::DataLoaders(data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)),
                               data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)));
  Learner learn(Model(net), std::move(dls), cross_entropy(), LearnerOptions().progress(false));
  net->eval();
  std::vector<torch::Tensor> before;
  for (const auto& b : net->buffers()) before.push_back(b.clone());
  diagnose::trace_overflow(learn, {ds.x.slice(0, 0, 16), ds.y.slice(0, 0, 16)});
  EXPECT_FALSE(net->is_training());
  const auto after = net->buffers();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], after[i])) << i;
  // No trace mode or emulation left on.
  EXPECT_FALSE(amp::ReducedPrecisionEmulation::is_enabled());
}

} // namespace
