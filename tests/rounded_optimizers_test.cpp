// mixtrain::optim: the five optimizers over parameters and state stored in bf16 (real bf16
// tensors), each update computed in fp32 and written back once by a rule. Python's
// tests/python/test_optim.py checks the core bitwise against torch.optim in fp32 and on
// bf16 values for every optimizer and option; here: the storage claim against bf16-pure's
// own pass (fp32 tensors of bf16 values, rounded by amp::round_update), torch's C++
// optimizers, save/load, and bad input.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <sstream>

namespace {

using namespace mixtrain;
using amp::WeightUpdate;

constexpr int64_t kBig = 5 * amp::kUpdateChunk + 29;  // two compute chunks of the core (4 spans each), six spans, a ragged tail

class RoundedOptimizersTest : public test::SeededTest {};

/// `fn` throws a c10::Error whose message (without torch's backtrace) is one line holding `words`.
template <typename Fn>
void expect_one_line_error(Fn fn, const std::string& words) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected: " << words;
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find(words), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

torch::Tensor random_bf16(int64_t n, int64_t seed, double scale = 1.0) {
  torch::manual_seed(seed);
  return (torch::randn({n}) * scale).to(torch::kBFloat16);
}

/// bf16 storage under mixtrain::optim::AdamW against bf16-pure's pass: fp32 tensors holding
/// the bf16 values, the same fp32 step, then amp::round_update on the weight and the state
/// rounded to nearest. Same numbers, same counts, for each rule.
void expect_storage_is_the_fp32_pass(WeightUpdate rule) {
  const torch::Tensor w0 = random_bf16(kBig, 1);
  torch::Tensor mine = w0.clone().requires_grad_();
  optim::AdamW opt({mine}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01), optim::Rounding().weight_update(rule).seed(9));

  torch::Tensor ref = w0.to(torch::kFloat);
  torch::Tensor m = torch::zeros_like(ref), v = torch::zeros_like(ref), comp = torch::zeros_like(ref);
  optim::UpdateRule r;
  r.kind = OptimizerKind::kAdamW;
  r.lr = 1e-3;
  r.weight_decay = 0.01;
  amp::LostUpdates ref_lost;
  for (int64_t step = 1; step <= 4; ++step) {
    const torch::Tensor g = random_bf16(kBig, 100 + step, 1e-3);
    mine.mutable_grad() = g.clone();
    opt.step();

    const torch::Tensor before = ref.clone();
    optim::ParamStep s;
    s.param = ref;
    s.grad = g.to(torch::kFloat);
    s.state = {m, v};
    s.step = step;
    optim::update_parameter(r, s, WeightUpdate::kNearest, 0);  // all fp32: the ops in place, nothing rounded
    ref_lost += amp::round_update(ref, before, rule, &comp, 9, amp::stochastic_stream(step, 0));
    amp::round_to_bf16_(m);
    amp::round_to_bf16_(v);

    ASSERT_EQ(mine.scalar_type(), torch::kBFloat16);
    ASSERT_TRUE(torch::equal(mine.detach().to(torch::kFloat), ref)) << "step " << step;
    auto& st = static_cast<torch::optim::AdamWParamState&>(*compat::optimizer_state_of(opt, mine));
    ASSERT_EQ(st.exp_avg().scalar_type(), torch::kBFloat16);
    ASSERT_TRUE(torch::equal(st.exp_avg().to(torch::kFloat), m));
    ASSERT_TRUE(torch::equal(st.exp_avg_sq().to(torch::kFloat), v));
  }
  const amp::LostUpdates lost = opt.lost_updates();
  EXPECT_EQ(lost.elements, ref_lost.elements);
  EXPECT_EQ(lost.intended, ref_lost.intended);
  EXPECT_EQ(lost.lost, ref_lost.lost);
  EXPECT_EQ(lost.intended_sq, ref_lost.intended_sq);  // the same chunks, summed in the same order
  EXPECT_EQ(lost.lost_sq, ref_lost.lost_sq);
  EXPECT_GT(lost.intended, 0);
  EXPECT_EQ(opt.lost_updates().intended, 0);  // counted since the last call
}

TEST_F(RoundedOptimizersTest, Bf16StorageIsBitwiseTheFp32PassRoundedOnceNearest) {
  expect_storage_is_the_fp32_pass(WeightUpdate::kNearest);
}
TEST_F(RoundedOptimizersTest, Bf16StorageIsBitwiseTheFp32PassRoundedOnceStochastic) {
  expect_storage_is_the_fp32_pass(WeightUpdate::kStochastic);
}
TEST_F(RoundedOptimizersTest, Bf16StorageIsBitwiseTheFp32PassRoundedOnceKahan) {
  expect_storage_is_the_fp32_pass(WeightUpdate::kKahan);
}

TEST_F(RoundedOptimizersTest, SmallUpdatesLandUnderStochasticAndKahanAndVanishUnderNearest) {
  // Gains of 1.0 and a steady gradient: Adam's step (about lr) is far below bf16's spacing at 1.0.
  const auto run = [](WeightUpdate rule) {
    torch::Tensor w = torch::ones({4096}, torch::kBFloat16).requires_grad_();
    optim::Adam opt({w}, torch::optim::AdamOptions(1e-4), optim::Rounding().weight_update(rule).seed(3));
    for (int i = 0; i < 200; ++i) {
      w.mutable_grad() = torch::ones({4096}, torch::kBFloat16);
      opt.step();
    }
    return std::make_pair(1.0 - w.detach().to(torch::kFloat).mean().item<double>(), opt.lost_updates().fraction());
  };
  const auto [nearest_moved, nearest_lost] = run(WeightUpdate::kNearest);
  const auto [stochastic_moved, stochastic_lost] = run(WeightUpdate::kStochastic);
  const auto [kahan_moved, kahan_lost] = run(WeightUpdate::kKahan);
  EXPECT_EQ(nearest_moved, 0.0);
  EXPECT_EQ(nearest_lost, 1.0);
  // fp32 would move them by 200 * 1e-4 = 0.02.
  EXPECT_NEAR(stochastic_moved, 0.02, 0.002);
  EXPECT_NEAR(kahan_moved, 0.02, 0.004);
  EXPECT_LT(stochastic_lost, 1.0);
}

TEST_F(RoundedOptimizersTest, InFp32TheyAreTorchsOwnOptimizersWhereTheOpsAgreeAndWithinUlpsWhereNot) {
  // libtorch's SGD is torch.optim's op for op: bitwise. Its Adam writes the first moment as
  // mul_ and add_ where torch.optim (and ours) uses lerp_: a few ulps apart.
  torch::manual_seed(4);
  const torch::Tensor w0 = torch::randn({1000});
  torch::Tensor a = w0.clone().requires_grad_(), b = w0.clone().requires_grad_();
  torch::optim::SGD theirs({a}, torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-4));
  optim::SGD ours({b}, torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-4));
  torch::Tensor c = w0.clone().requires_grad_(), d = w0.clone().requires_grad_();
  torch::optim::AdamW theirs_adam({c}, torch::optim::AdamWOptions(1e-2));
  optim::AdamW ours_adam({d}, torch::optim::AdamWOptions(1e-2));
  for (int i = 0; i < 10; ++i) {
    const torch::Tensor g = torch::randn({1000});
    for (torch::Tensor* t : {&a, &b, &c, &d}) t->mutable_grad() = g.clone();
    theirs.step();
    ours.step();
    theirs_adam.step();
    ours_adam.step();
  }
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::equal(a, w0));
  EXPECT_TRUE(torch::allclose(c, d, /*rtol=*/1e-6, /*atol=*/1e-7));
  // They are torch's classes: what the Learner asks of an optimizer, it answers.
  EXPECT_EQ(kind_of(ours_adam), OptimizerKind::kAdamW);
  EXPECT_EQ(kind_of(ours), OptimizerKind::kSgd);
  EXPECT_EQ(*state_tensors_per_param(ours_adam), 2);
}

TEST_F(RoundedOptimizersTest, SaveAndLoadGoOnBitwiseWithTheKahanCompensation) {
  const torch::Tensor w0 = random_bf16(5000, 2);
  const auto grad = [](int step) { return random_bf16(5000, 50 + step, 1e-2); };
  const auto opts = torch::optim::RMSpropOptions(1e-3).momentum(0.9).centered(true);
  const auto rounding = optim::Rounding().weight_update(WeightUpdate::kKahan);
  // Straight through: 6 steps.
  torch::Tensor straight = w0.clone().requires_grad_();
  optim::RMSprop a({straight}, opts, rounding);
  for (int s = 0; s < 6; ++s) {
    straight.mutable_grad() = grad(s);
    a.step();
  }
  // 3 steps, saved, loaded into a new optimizer over a copy, 3 more.
  torch::Tensor first = w0.clone().requires_grad_();
  optim::RMSprop b({first}, opts, rounding);
  for (int s = 0; s < 3; ++s) {
    first.mutable_grad() = grad(s);
    b.step();
  }
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive out;
    b.save(out);
    out.save_to(bytes);
  }
  torch::Tensor resumed = first.detach().clone().requires_grad_();
  optim::RMSprop c({resumed}, opts, rounding);
  {
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    c.load(in);
  }
  EXPECT_EQ(c.steps_taken(), 3);
  for (int s = 3; s < 6; ++s) {
    resumed.mutable_grad() = grad(s);
    c.step();
  }
  EXPECT_TRUE(torch::equal(straight, resumed));
  // Loaded by an optimizer that rounds otherwise: it would drop the Kahan compensations, so
  // it is refused, in one line that names both.
  bytes.clear();
  bytes.seekg(0);
  torch::Tensor other = w0.clone().requires_grad_();
  optim::RMSprop d({other}, opts, optim::Rounding().weight_update(WeightUpdate::kStochastic));
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  expect_one_line_error([&] { d.load(in); }, "saved with weight_update=kahan, this optimizer rounds by stochastic");
  // A rule without state (nearest) goes on under the loading optimizer's own (a branch that
  // changes it), with the step count.
  optim::RMSprop e({first.detach().clone().requires_grad_()}, opts, optim::Rounding().weight_update(WeightUpdate::kNearest));
  std::stringstream nearest_bytes;
  {
    torch::serialize::OutputArchive out;
    e.save(out);
    out.save_to(nearest_bytes);
  }
  optim::RMSprop f({w0.clone().requires_grad_()}, opts, optim::Rounding().weight_update(WeightUpdate::kStochastic));
  {
    torch::serialize::InputArchive from_nearest;
    from_nearest.load_from(nearest_bytes);
    f.load(from_nearest);
  }
  EXPECT_EQ(f.rounding().weight_update(), WeightUpdate::kStochastic);
  // A rule code that names no rule (a damaged archive) is one line, not an internal assert.
  std::stringstream damaged;
  {
    torch::serialize::OutputArchive out;
    e.torch::optim::RMSprop::save(out);  // torch's part as it is, then the rounding's, damaged
    out.write("mixtrain_rounding/steps", torch::tensor(int64_t{3}));
    out.write("mixtrain_rounding/weight_update", torch::tensor(int64_t{7}));
    out.save_to(damaged);
  }
  torch::serialize::InputArchive bad;
  bad.load_from(damaged);
  optim::RMSprop g({w0.clone().requires_grad_()}, opts, rounding);
  expect_one_line_error([&] { g.load(bad); }, "the archive's weight_update is none of nearest, stochastic and kahan");
}

TEST_F(RoundedOptimizersTest, BadInputIsOneLine) {
  torch::Tensor half = torch::ones({8}, torch::kHalf).requires_grad_();
  optim::AdamW fp16({half}, {}, optim::Rounding().weight_update(WeightUpdate::kStochastic));
  half.mutable_grad() = torch::ones({8}, torch::kHalf);
  expect_one_line_error([&] { fp16.step(); }, "fp16 parameters take 'nearest' only");

  torch::Tensor w = torch::ones({8}).requires_grad_();
  optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
  w.mutable_grad() = torch::ones({9});
  expect_one_line_error([&] { sgd.step(); }, "the gradient must be a floating-point tensor of the parameter's shape");
}

} // namespace
