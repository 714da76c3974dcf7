// Master-weights mode: norm layers fp32, fp32 masters, true skips, the
// max_noskip / max_scale rule, static scale, flat masters, clipping.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <sstream>

namespace {

using namespace mixtrain;
namespace nn = torch::nn;

/// A user module with every kind of norm layer, called through holder members.
struct NormNetImpl : nn::Module {
  NormNetImpl()
      : conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)))),
        bn(register_module("bn", nn::BatchNorm2d(4))),
        gn(register_module("gn", nn::GroupNorm(2, 4))),
        in(register_module("in", nn::InstanceNorm2d(nn::InstanceNorm2dOptions(4).affine(true)))),
        fc(register_module("fc", nn::Linear(4 * 4 * 4, 8))),
        ln(register_module("ln", nn::LayerNorm(nn::LayerNormOptions({8})))),
        out(register_module("out", nn::Linear(8, 3))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(in(gn(bn(conv(x)))));
    return out(torch::relu(ln(fc(x.flatten(1)))));
  }
  nn::Conv2d conv;
  nn::BatchNorm2d bn;
  nn::GroupNorm gn;
  nn::InstanceNorm2d in;
  nn::Linear fc;
  nn::LayerNorm ln;
  nn::Linear out;
};
TORCH_MODULE(NormNet);

data::DataLoaders image_loaders() {
  auto make = [](int64_t n, uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    torch::Tensor y = torch::randint(3, {n}, gen, torch::kLong);
    torch::Tensor x = torch::randn({n, 1, 4, 4}, gen) + y.to(torch::kFloat).view({n, 1, 1, 1});
    return data::Dataset{x, y};
  };
  return data::DataLoaders::from_split({make(128, 1), make(64, 2)}, 16, 3);
}

data::DataLoaders master_loaders() {
  return data::DataLoaders::from_split({test::blobs(128, 3, 4, 41), test::blobs(64, 3, 4, 42)}, 16, 3);
}

std::string serialized(torch::optim::Optimizer& opt) {
  std::ostringstream out;
  torch::save(opt, out);
  return out.str();
}

class MasterWeightsTest : public test::SeededTest {};

TEST_F(MasterWeightsTest, NormLayersAndBuffersStayFp32EverythingElseIsDtype) {
  NormNet net;
  Learner learn(net, image_loaders(), cross_entropy(), LearnerOptions().progress(false));
  learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16));
  for (const auto& kv : net->named_parameters()) {
    const bool norm = kv.key().rfind("bn.", 0) == 0 || kv.key().rfind("gn.", 0) == 0 ||
                      kv.key().rfind("in.", 0) == 0 || kv.key().rfind("ln.", 0) == 0;
    EXPECT_EQ(kv.value().scalar_type(), norm ? torch::kFloat : torch::kBFloat16) << kv.key();
  }
  EXPECT_EQ(net->bn->running_mean.scalar_type(), torch::kFloat);
  EXPECT_EQ(net->bn->running_var.scalar_type(), torch::kFloat);
  // The forward pass works through every norm (LayerNorm/GroupNorm need fp32 inputs on CPU).
  learn.fit(1, 1e-2);
  EXPECT_EQ(learn.recorder().steps().size(), 8u);
  EXPECT_TRUE(std::isfinite(learn.recorder().values().back().valid_loss));
  EXPECT_EQ(net->conv->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(net->bn->running_mean.scalar_type(), torch::kFloat);
}

TEST_F(MasterWeightsTest, MastersAreFp32CopiesAndOptimizerHoldsThem) {
  Learner learn(nn::Linear(4, 3), master_loaders(), cross_entropy(), LearnerOptions().progress(false));
  learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16));
  auto mw = learn.get_cb<amp::MasterWeights>();
  const auto params = learn.model().module().parameters();
  ASSERT_EQ(mw->masters().size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(mw->masters()[i].scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::equal(mw->masters()[i], params[i].to(torch::kFloat)));
  }
  EXPECT_TRUE(learn.opt().param_groups()[0].params()[0].is_same(mw->masters()[0]));
  auto& o = static_cast<torch::optim::AdamWOptions&>(learn.opt().param_groups()[0].options());
  EXPECT_DOUBLE_EQ(o.eps(), 1e-5);  // fastai's AdamW options kept
  EXPECT_EQ(mw->loss_scale(), 65536);
  const auto mem = mw->memory();
  EXPECT_EQ(mem.model, (4 * 3 + 3) * 2);
  EXPECT_EQ(mem.masters, (4 * 3 + 3) * 4);
}

TEST_F(MasterWeightsTest, OverflowStepLeavesWeightsMastersAndOptimizerStateBitwiseUnchanged) {
  for (bool use_sgd : {true, false}) {
    SCOPED_TRACE(use_sgd ? "SGD momentum + weight decay" : "AdamW");
    Learner learn(nn::Linear(4, 3), master_loaders(), cross_entropy(),
                  LearnerOptions().progress(false).opt_func(use_sgd ? sgd(0.9, 0.01) : adamw()));
    learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16));
    auto mw = learn.get_cb<amp::MasterWeights>();
    struct Snapshot : Callback {
      std::shared_ptr<amp::MasterWeights> mw;
      std::vector<torch::Tensor> weights, masters;
      std::string opt_state;
      std::vector<bool> unchanged;
      Snapshot() { order = 1; }
      void before_batch(Learner& l) override {
        if (!l.training()) return;
        weights.clear();
        masters.clear();
        for (auto& p : l.model().module().parameters()) weights.push_back(p.detach().clone());
        for (auto& m : mw->masters()) masters.push_back(m.detach().clone());
        opt_state = serialized(l.opt());
      }
      void after_batch(Learner& l) override {
        if (!l.training()) return;
        bool same = serialized(l.opt()) == opt_state;
        const auto params = l.model().module().parameters();
        for (size_t i = 0; i < params.size(); ++i) same = same && torch::equal(params[i], weights[i]);
        for (size_t i = 0; i < masters.size(); ++i) same = same && torch::equal(mw->masters()[i], masters[i]);
        unchanged.push_back(same);
      }
    };
    auto snap = std::make_shared<Snapshot>();
    snap->mw = mw;
    learn.add_cb(snap).add_cb(std::make_shared<test::InjectOverflow>(std::set<int64_t>{3, 4}));
    learn.fit(1, 1e-2);
    ASSERT_EQ(snap->unchanged.size(), 8u);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(snap->unchanged[i], i == 3 || i == 4) << "step " << i;
    EXPECT_EQ(learn.recorder().skipped_steps(), 2);
    EXPECT_EQ(mw->loss_scale(), 16384);
    EXPECT_TRUE(learn.recorder().steps()[3].skipped);
  }
}

TEST_F(MasterWeightsTest, HalvingAndDoublingFollowMaxNoskipAndMaxScale) {
  Learner learn(nn::Linear(4, 3), master_loaders(), cross_entropy(), LearnerOptions().progress(false));
  learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16).max_noskip(2).max_scale(131072));
  learn.add_cb(std::make_shared<test::InjectOverflow>(std::set<int64_t>{5}));
  learn.fit(1, 1e-2);
  std::vector<double> used;
  for (const auto& s : learn.recorder().steps()) used.push_back(s.scale);
  // clean, clean -> x2 (2^17); clean, clean -> capped at 2^17; clean; overflow -> /2; clean, clean -> x2.
  EXPECT_EQ(used, (std::vector<double>{65536, 65536, 131072, 131072, 131072, 131072, 65536, 65536}));
  EXPECT_EQ(learn.get_cb<amp::MasterWeights>()->loss_scale(), 131072);
}

TEST_F(MasterWeightsTest, StaticScaleNeverChangesButStillSkipsOverflow) {
  Learner learn(nn::Linear(4, 3), master_loaders(), cross_entropy(), LearnerOptions().progress(false));
  learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16).dynamic(false).max_noskip(1));
  learn.add_cb(std::make_shared<test::InjectOverflow>(std::set<int64_t>{2}));
  learn.fit(1, 1e-2);
  for (const auto& s : learn.recorder().steps()) EXPECT_EQ(s.scale, 512);  // fastai v1's static default
  EXPECT_TRUE(learn.recorder().steps()[2].skipped);
}

TEST_F(MasterWeightsTest, FlatAndPerParameterMastersGiveTheSameWeights) {
  auto train = [](bool flat) {
    torch::manual_seed(7);
    NormNet net;
    Learner learn(net, image_loaders(), cross_entropy(), LearnerOptions().progress(false));
    learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16).flat_master(flat));
    learn.fit(2, 1e-2);
    auto mw = learn.get_cb<amp::MasterWeights>();
    EXPECT_EQ(mw->masters().size(), flat ? learn.opt().param_groups().size() : net->parameters().size());  // flat: one per group
    std::vector<torch::Tensor> out;
    for (auto& p : net->parameters()) out.push_back(p.detach().to(torch::kFloat).clone());
    return out;
  };
  const auto a = train(false), b = train(true);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-2, 1e-3)) << i;
}

TEST_F(MasterWeightsTest, ClipSeesUnscaledFp32Gradients) {
  Learner learn(nn::Linear(4, 3), master_loaders(), cross_entropy(), LearnerOptions().progress(false).opt_func(sgd(0.0)));
  learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16).clip(0.01));
  struct MasterGradNorm : Callback {
    std::shared_ptr<amp::MasterWeights> mw;
    std::vector<double> norms;
    MasterGradNorm() { order = 30; }  // after MasterWeights' before_step
    void before_step(Learner&) override {
      double sq = 0;
      for (auto& m : mw->masters()) {
        EXPECT_EQ(m.grad().scalar_type(), torch::kFloat);
        sq += m.grad().pow(2).sum().item<double>();
      }
      norms.push_back(std::sqrt(sq));
    }
  };
  auto probe = std::make_shared<MasterGradNorm>();
  probe->mw = learn.get_cb<amp::MasterWeights>();
  learn.add_cb(probe);
  learn.fit(1, 1e-2);
  for (const auto& s : learn.recorder().steps()) {
    EXPECT_GT(s.grad_norm, 0.01);  // the true norm, measured before clipping...
    EXPECT_LT(s.grad_norm, 100.0);  // ...and unscaled (scaled it would be ~65536x)
  }
  for (double n : probe->norms) EXPECT_LE(n, 0.01 * (1 + 1e-5));
}

TEST_F(MasterWeightsTest, Fp16OnCpuIsAClearErrorAndToFp32Restores) {
  Learner learn(nn::Linear(4, 3), master_loaders(), cross_entropy(), LearnerOptions().progress(false));
  EXPECT_THROW_WITH(learn.to_half(amp::MasterWeightsOptions().dtype(torch::kHalf)), "fp16-master needs CUDA");
  learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16));
  learn.fit(1, 1e-2);
  const torch::Tensor master = learn.get_cb<amp::MasterWeights>()->masters()[0].detach().clone();
  learn.to_fp32();
  EXPECT_EQ(learn.get_cb<amp::MasterWeights>(), nullptr);
  const torch::Tensor w = learn.model().module().parameters()[0];
  EXPECT_EQ(w.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(w, master));  // the fp32 masters, not the bf16-rounded weights
  learn.fit(1, 1e-2);                    // and it trains on as fp32
  EXPECT_TRUE(learn.opt().param_groups()[0].params()[0].is_same(w));
}

} // namespace

namespace {

// fastai v1 rebuilds its masters at every fit; weights put into the model after
// to_half() must not be overwritten by the old masters at the first step.
TEST(MasterWeightsResyncTest, WeightsLoadedIntoTheModelAfterToHalfAreKept) {
  torch::manual_seed(11);
  Learner learn(nn::Linear(4, 3), master_loaders(), cross_entropy(), LearnerOptions().progress(false));
  learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16));
  learn.fit(1, 1e-2);
  // New weights, as a user would load them from a file.
  std::vector<torch::Tensor> wanted;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : learn.model().module().parameters()) {
      p.copy_(torch::full_like(p, 0.25));
      wanted.push_back(p.clone());
    }
  }
  learn.fit(1, 1e-9);  // a negligible step: the weights must stay where they were put
  const auto params = learn.model().module().parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::allclose(params[i].to(torch::kFloat), wanted[i].to(torch::kFloat), 0, 1e-2)) << i;
}

// A partial accumulation at an epoch's end (8 batches, accum 3) must not leak into
// the next epoch: with master weights the optimizer holds the masters, so clearing
// the optimizer's gradients alone left the model's.
TEST(MasterWeightsResyncTest, APartialAccumulationDoesNotLeakIntoTheNextEpoch) {
  torch::manual_seed(12);
  struct GradsAtEpochStart : Callback {
    std::vector<bool> clean;  // per epoch: no gradient left when its first batch starts
    void before_batch(Learner& l) override {
      if (!l.training() || l.iter() != 0) return;
      bool none = true;
      for (const auto& p : l.model().module().parameters())
        if (p.grad().defined() && p.grad().abs().sum().item<double>() != 0) none = false;
      clean.push_back(none);
    }
  };
  Learner learn(nn::Linear(4, 3), master_loaders(), cross_entropy(), LearnerOptions().progress(false));
  ASSERT_EQ(learn.dls().train.num_batches(), 8);
  learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16));
  learn.add_cb(std::make_shared<callbacks::GradientAccumulation>(3));
  auto probe = std::make_shared<GradsAtEpochStart>();
  learn.add_cb(probe);
  learn.fit(3, 1e-2);
  EXPECT_EQ(probe->clean, (std::vector<bool>{true, true, true}));
}

} // namespace

namespace {

// flat_master steps one buffer per group; a parameter that got no gradient (an
// unused layer here) must not receive weight decay through it.
TEST(MasterWeightsFlatTest, AParameterWithoutAGradientKeepsItsWeights) {
  struct WithUnusedImpl : nn::Module {
    WithUnusedImpl()
        : used(register_module("used", nn::Linear(4, 3))), unused(register_module("unused", nn::Linear(4, 3))) {}
    torch::Tensor forward(torch::Tensor x) { return used(x); }
    nn::Linear used, unused;
  };
  TORCH_MODULE(WithUnused);
  for (bool flat : {false, true}) {
    SCOPED_TRACE(flat ? "flat" : "per parameter");
    torch::manual_seed(13);
    WithUnused net;
    Learner learn(net, master_loaders(), cross_entropy(), LearnerOptions().progress(false));
    learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16).flat_master(flat));
    const torch::Tensor before = net->unused->weight.detach().clone();
    learn.fit(2, 1e-1);  // AdamW's decoupled weight decay would shrink it by ~1e-3 a step
    EXPECT_TRUE(torch::equal(net->unused->weight, before));
    EXPECT_FALSE(torch::equal(net->used->weight.to(torch::kFloat), before.to(torch::kFloat)));
  }
}

} // namespace
