// GradScaler against torch's rule: scripted overflows, state_dict, several
// optimizers, clipping after unscale, accumulation, errors and extras.
#include "test_util.h"

#include <mixtrain/amp/grad_scaler.h>

#include <cmath>

namespace {

using mixtrain::amp::GradScaler;
using mixtrain::amp::GradScalerOptions;

/// torch's _amp_update_scale_ rule, written out independently: the expected
/// scale after each step for a given overflow pattern.
std::vector<double> torch_rule(double scale, double growth, double backoff, int64_t interval,
                               const std::vector<bool>& overflow, std::vector<int64_t>* trackers = nullptr) {
  std::vector<double> out;
  int64_t tracker = 0;
  for (bool inf : overflow) {
    if (inf) {
      scale *= backoff;
      tracker = 0;
    } else if (++tracker == interval) {
      if (std::isfinite(scale * growth)) scale *= growth;
      tracker = 0;
    }
    out.push_back(scale);
    if (trackers) trackers->push_back(tracker);
  }
  return out;
}

struct Rig {
  torch::nn::Linear model{torch::nn::Linear(3, 2)};
  torch::optim::SGD opt{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01)};
  torch::Tensor x = torch::randn({4, 3});

  /// One step with an optional injected non-finite value in the weight grad.
  bool step(GradScaler& scaler, double inject = 0.0) {
    opt.zero_grad();
    scaler.scale(model->forward(x).pow(2).mean()).backward();
    if (inject != 0.0) model->weight.grad()[0][0] = inject;
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  }
};

class GradScalerTest : public mixtrain::test::SeededTest {};

TEST_F(GradScalerTest, OverflowAtFirstThreeStepsThenGrowthEveryThree) {
  Rig rig;
  GradScaler scaler(GradScalerOptions().growth_interval(3));
  const std::vector<bool> pattern = {true, true, true, false, false, false, false, false, false, false, true, false};
  std::vector<int64_t> expected_trackers;
  const auto expected = torch_rule(65536, 2, 0.5, 3, pattern, &expected_trackers);
  for (size_t i = 0; i < pattern.size(); ++i) {
    const torch::Tensor w = rig.model->weight.detach().clone();
    const bool stepped = rig.step(scaler, pattern[i] ? INFINITY : 0.0);
    EXPECT_EQ(stepped, !pattern[i]) << i;
    EXPECT_EQ(torch::equal(w, rig.model->weight), pattern[i]) << "weights moved on a skipped step " << i;
    EXPECT_EQ(scaler.get_scale(), expected[i]) << i;
    EXPECT_EQ(scaler.growth_tracker(), expected_trackers[i]) << i;
  }
  EXPECT_EQ(expected[2], 8192);
  EXPECT_EQ(expected[5], 16384);
}

TEST_F(GradScalerTest, NanIsAnOverflowToo) {
  Rig rig;
  GradScaler scaler;
  EXPECT_FALSE(rig.step(scaler, NAN));
  EXPECT_EQ(scaler.get_scale(), 32768);
  EXPECT_FALSE(rig.step(scaler, -INFINITY));
  EXPECT_EQ(scaler.get_scale(), 16384);
  EXPECT_TRUE(scaler.last_step_overflowed());
}

TEST_F(GradScalerTest, CleanRunGrowsByExactPowersOfTwo) {
  Rig rig;
  GradScaler scaler(GradScalerOptions().init_scale(1.0).growth_interval(2));
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(rig.step(scaler));
  EXPECT_EQ(scaler.get_scale(), 1024.0);  // 2^(20/2)
  for (int i = 0; i < 3; ++i) rig.step(scaler, INFINITY);
  EXPECT_EQ(scaler.get_scale(), 128.0);
  EXPECT_EQ(std::log2(scaler.get_scale()), std::floor(std::log2(scaler.get_scale())));
}

TEST_F(GradScalerTest, StateDictRoundTripMidRun) {
  Rig rig;
  GradScaler a(GradScalerOptions().growth_interval(4));
  for (bool inf : {true, false, false, true, false, false, false}) rig.step(a, inf ? INFINITY : 0.0);
  const auto state = a.state_dict();
  for (const char* key : {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})
    EXPECT_TRUE(state.contains(key)) << key;
  // torch's types: the counters are ints (Python's update() rejects a float growth_interval).
  EXPECT_TRUE(state.at("growth_interval").isInt());
  EXPECT_TRUE(state.at("_growth_tracker").isInt());
  EXPECT_TRUE(state.at("scale").isDouble());
  EXPECT_EQ(state.at("_growth_tracker").toInt(), 3);
  GradScaler b;
  b.load_state_dict(state);
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.options().growth_interval(), 4);
  for (bool inf : {false, false, true, false}) {
    rig.step(a, inf ? INFINITY : 0.0);
    rig.step(b, inf ? INFINITY : 0.0);
    EXPECT_EQ(a.get_scale(), b.get_scale());
    EXPECT_EQ(a.growth_tracker(), b.growth_tracker());
  }
  EXPECT_THROW_WITH(b.load_state_dict(mixtrain::amp::empty_grad_scaler_state()), "state dict is empty");
  mixtrain::amp::GradScalerState partial = mixtrain::amp::empty_grad_scaler_state();
  partial.insert("scale", 2.0);
  EXPECT_THROW_WITH(b.load_state_dict(partial), "missing 'growth_factor'");
}

TEST_F(GradScalerTest, TwoOptimizersSkipIndependentlyWithOneUpdate) {
  torch::nn::Linear l1(3, 3), l2(3, 1);
  torch::optim::SGD o1(l1->parameters(), 0.1), o2(l2->parameters(), 0.1);
  GradScaler scaler;
  const torch::Tensor x = torch::randn({4, 3});
  scaler.scale(l2->forward(l1->forward(x)).sum()).backward();
  l2->weight.grad()[0][0] = INFINITY;
  const torch::Tensor w1 = l1->weight.detach().clone(), w2 = l2->weight.detach().clone();
  EXPECT_TRUE(scaler.step(o1));
  EXPECT_FALSE(scaler.step(o2));
  scaler.update();
  EXPECT_FALSE(torch::equal(w1, l1->weight));
  EXPECT_TRUE(torch::equal(w2, l2->weight));
  EXPECT_EQ(scaler.get_scale(), 32768);  // the overflow in o2 backs off the shared scale
}

TEST_F(GradScalerTest, ClipAfterUnscaleSeesTrueNorms) {
  torch::Tensor w = torch::zeros({4}, torch::requires_grad());
  torch::optim::SGD opt({w}, 0.1);
  GradScaler scaler;
  const torch::Tensor c = torch::tensor({3.0f, 4.0f, 0.0f, 0.0f});  // d(loss)/dw = c, norm 5
  scaler.scale((w * c).sum()).backward();
  EXPECT_NEAR(w.grad().norm().item<double>(), 5.0 * 65536, 1e-2);
  scaler.unscale_(opt);
  const double norm = torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{w}, 1.0);
  EXPECT_NEAR(norm, 5.0, 1e-6);
  EXPECT_NEAR(w.grad().norm().item<double>(), 1.0, 1e-5);
  EXPECT_TRUE(scaler.step(opt));  // already unscaled: step does not unscale again
  scaler.update();
  EXPECT_TRUE(torch::allclose(w.detach(), torch::tensor({-0.06f, -0.08f, 0.0f, 0.0f}), 1e-6, 1e-7));
}

TEST_F(GradScalerTest, AccumulationMatchesUnscaledSum) {
  torch::nn::Linear a(3, 2), b(3, 2);
  { torch::NoGradGuard g; b->weight.copy_(a->weight); b->bias.copy_(a->bias); }
  torch::optim::SGD oa(a->parameters(), 0.1), ob(b->parameters(), 0.1);
  GradScaler scaler(GradScalerOptions().init_scale(1024));
  const torch::Tensor x1 = torch::randn({4, 3}), x2 = torch::randn({4, 3});
  for (const auto& x : {x1, x2}) {
    scaler.scale(a->forward(x).pow(2).mean() / 2).backward();  // step/update only on the boundary
    (b->forward(x).pow(2).mean() / 2).backward();
  }
  EXPECT_TRUE(scaler.step(oa));
  scaler.update();
  ob.step();
  EXPECT_TRUE(torch::allclose(a->weight, b->weight, 1e-6, 1e-7));
  EXPECT_EQ(scaler.get_scale(), 1024);
}

TEST_F(GradScalerTest, MisuseIsAnError) {
  Rig rig;
  GradScaler scaler;
  scaler.scale(rig.model->forward(rig.x).sum()).backward();
  scaler.unscale_(rig.opt);
  EXPECT_THROW_WITH(scaler.unscale_(rig.opt), "unscale_() has already been called");
  scaler.step(rig.opt);
  EXPECT_THROW_WITH(scaler.step(rig.opt), "step() has already been called");
  EXPECT_THROW_WITH(scaler.unscale_(rig.opt), "unscale_() is being called after step()");
  scaler.update();
  EXPECT_THROW_WITH(scaler.update(), "No inf checks were recorded");
}

TEST_F(GradScalerTest, ParameterWithoutGradientIsIgnored) {
  torch::nn::Linear used(3, 1), unused(3, 1);
  std::vector<torch::Tensor> params = used->parameters();
  for (auto& p : unused->parameters()) params.push_back(p);
  torch::optim::SGD opt(params, 0.1);
  GradScaler scaler;
  scaler.scale(used->forward(torch::randn({2, 3})).sum()).backward();
  EXPECT_FALSE(unused->weight.grad().defined());
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
}

TEST_F(GradScalerTest, DisabledIsAPassThrough) {
  Rig rig;
  GradScaler scaler(GradScalerOptions().enabled(false));
  const torch::Tensor loss = torch::tensor(3.0);
  EXPECT_TRUE(torch::equal(scaler.scale(loss), loss));
  EXPECT_TRUE(rig.step(scaler, INFINITY));  // no check when disabled, as torch
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(scaler.state_dict().size(), 0u);
  scaler.load_state_dict(GradScaler().state_dict());  // ignored, as torch does
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

TEST_F(GradScalerTest, OptionsValidation) {
  EXPECT_THROW_WITH(GradScaler(GradScalerOptions().growth_factor(1.0)), "Invalid growth_factor: 1 (must be > 1)");
  EXPECT_THROW_WITH(GradScaler(GradScalerOptions().backoff_factor(1.0)), "Invalid backoff_factor");
  EXPECT_THROW_WITH(GradScaler(GradScalerOptions().backoff_factor(0.0)), "Invalid backoff_factor");
  EXPECT_THROW_WITH(GradScaler(GradScalerOptions().growth_interval(0)), "Invalid growth_interval: 0");
  EXPECT_THROW_WITH(GradScaler(GradScalerOptions().init_scale(0)), "Invalid init_scale");
  EXPECT_THROW_WITH(GradScaler(GradScalerOptions().hysteresis(0)), "Invalid hysteresis");
  EXPECT_THROW_WITH(GradScaler(GradScalerOptions().init_scale(8).max_scale(4)), "must lie in");
}

TEST_F(GradScalerTest, MaxScaleMinScaleAndHysteresis) {
  Rig rig;
  GradScaler capped(GradScalerOptions().init_scale(4).growth_interval(1).max_scale(16));
  for (int i = 0; i < 5; ++i) rig.step(capped);
  EXPECT_EQ(capped.get_scale(), 16);

  GradScaler floored(GradScalerOptions().init_scale(4).min_scale(1));
  rig.step(floored, INFINITY);
  rig.step(floored, INFINITY);
  EXPECT_EQ(floored.get_scale(), 1);
  EXPECT_THROW_WITH(rig.step(floored, INFINITY), "still overflow at min_scale");

  GradScaler patient(GradScalerOptions().hysteresis(2));
  EXPECT_FALSE(rig.step(patient, INFINITY));  // skipped, but tolerated
  EXPECT_EQ(patient.get_scale(), 65536);
  EXPECT_FALSE(rig.step(patient, INFINITY));  // second in a row: back off
  EXPECT_EQ(patient.get_scale(), 32768);
  EXPECT_TRUE(rig.step(patient));
  EXPECT_FALSE(rig.step(patient, INFINITY));  // a clean step does not refill the budget (Megatron): back off
  EXPECT_EQ(patient.get_scale(), 16384);

  GradScaler consecutive(GradScalerOptions().hysteresis(2).consecutive_hysteresis(true));
  EXPECT_FALSE(rig.step(consecutive, INFINITY));
  EXPECT_TRUE(rig.step(consecutive));
  EXPECT_FALSE(rig.step(consecutive, INFINITY));  // a clean step refilled it: tolerated again
  EXPECT_EQ(consecutive.get_scale(), 65536);
}

} // namespace

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// C++ -> Python's GradScaler -> C++, through files as a user would move them.
TEST_F(GradScalerTest, StateDictRoundTripsThroughPythonsGradScaler) {
  ASSERT_TRUE(mixtrain::test::python_torch_available()) << mixtrain::test::kNoPythonTorch;
  const std::string dir = mixtrain::test::scratch_dir("scaler_python");
  Rig rig;
  GradScaler a(GradScalerOptions().init_scale(1024).growth_interval(7));
  for (bool inf : {true, false, false, false}) rig.step(a, inf ? INFINITY : 0.0);
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(a.state_dict()));
  std::ofstream(dir + "/cpp.pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));

  // torch 2.x's GradScaler runs on the CPU ("cpu"): it loads our state, takes one real
  // finite step with its own update(), and saves; we load what it wrote.
  const std::string script = dir + "/roundtrip.py";
  // torch.load's default (weights_only, torch 2.6+) refuses the type tag libtorch's
  // pickler writes on a typed dict (torch.jit._pickle.restore_type_tag): allowed by name.
  std::ofstream(script) << R"(import sys, torch
import torch.jit._pickle
with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
    d = torch.load(sys.argv[1])
assert type(d["growth_interval"]) is int and type(d["_growth_tracker"]) is int, d
assert type(d["scale"]) is float, d
s = torch.amp.GradScaler("cpu")
s.load_state_dict(d)
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
s.scale(model(torch.ones(1, 2)).sum()).backward()
s.step(opt)
s.update()  # Python's own change (one more finite step), to see it come back
torch.save(s.state_dict(), sys.argv[2])
)";
  const std::string cmd = std::string(MIXTRAIN_PYTHON) + " " + script + " " + dir + "/cpp.pt " + dir + "/py.pt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  const std::string py = read_bytes(dir + "/py.pt");
  const c10::IValue loaded = torch::pickle_load(std::vector<char>(py.begin(), py.end()));
  ASSERT_TRUE(loaded.isGenericDict());
  GradScaler b;
  b.load_state_dict(loaded.toGenericDict());
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.options().growth_interval(), 7);
  EXPECT_EQ(b.growth_tracker(), a.growth_tracker() + 1);
}

} // namespace

namespace {

// An Embedding with sparse gradients: unscaled through the values (torch's way),
// the same step as without a scaler, and an inf in the values is a skip.
TEST_F(GradScalerTest, SparseGradientsAreUnscaledAndChecked) {
  auto run = [](bool scaled, double inject) {
    torch::manual_seed(17);
    torch::nn::Embedding emb(torch::nn::EmbeddingOptions(10, 4).sparse(true));
    torch::optim::SGD opt(emb->parameters(), torch::optim::SGDOptions(0.5));
    GradScaler scaler(GradScalerOptions().enabled(scaled).init_scale(1024));
    const torch::Tensor idx = torch::tensor({1, 3, 3, 7}, torch::kLong);
    const torch::Tensor loss = emb(idx).pow(2).sum();
    scaler.scale(loss).backward();
    EXPECT_TRUE(emb->weight.grad().is_sparse());
    if (inject != 0) emb->weight.grad()._values()[0][0] = inject;
    const bool stepped = scaler.step(opt);
    scaler.update();
    return std::make_pair(emb->weight.detach().clone(), stepped);
  };
  const auto plain = run(false, 0), scaled = run(true, 0);
  EXPECT_TRUE(scaled.second);
  EXPECT_TRUE(torch::allclose(scaled.first, plain.first, 0, 1e-6));
  const auto overflow = run(true, INFINITY);
  EXPECT_FALSE(overflow.second);
  torch::manual_seed(17);
  torch::nn::Embedding fresh(torch::nn::EmbeddingOptions(10, 4).sparse(true));
  EXPECT_TRUE(torch::equal(overflow.first, fresh->weight));  // skipped: the weights did not move
}

} // namespace
