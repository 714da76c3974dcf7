// mixtrain::optim: the five optimizers over parameters and state stored in bf16 (real bf16
// tensors), each update computed in fp32 and written back once by a rule. Python's
// tests/python/test_optim.py checks the core bitwise against torch.optim (with a correctly
// rounded root) in fp32 and on bf16 values for every optimizer and option; here: the storage
// claim against bf16-pure's own pass (fp32 tensors of bf16 values, rounded by
// amp::round_update), Adam's fused pass against the ops, the core's root, torch's C++
// optimizers, save/load, and bad input.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <cmath>
#include <cstdlib>
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

/// Adam's step through the core on `param` (a view, contiguous or not), its moments and a
/// Kahan compensation of its shape; returns what it counted.
amp::LostUpdates adam_core_step(torch::Tensor param, const torch::Tensor& grad, std::vector<torch::Tensor> state,
                                const torch::Tensor& comp, OptimizerKind kind, bool amsgrad, WeightUpdate rule,
                                int64_t step) {
  optim::UpdateRule r;
  r.kind = kind;
  r.lr = 1e-2;
  r.weight_decay = 0.05;
  r.amsgrad = amsgrad;
  optim::ParamStep s;
  s.param = param;
  s.grad = grad;
  s.state = std::move(state);
  s.compensation = comp;
  s.step = step;
  s.stream = amp::stochastic_stream(step, 0);
  return optim::update_parameter(r, s, rule, 11);
}

TEST_F(RoundedOptimizersTest, AdamsFusedPassWithAndWithoutAvx2AndTheOpsOnAStridedTensorGiveTheSameBits) {
  // A contiguous CPU tensor takes the fused Adam pass (AVX2+FMA here where the CPU has them,
  // element by element under MIXTRAIN_CPU_AVX2=0, as on a CPU without); the same values seen
  // through a transpose take torch's ops on fp32 copies. All three are the core's arithmetic:
  // the same bits, the same counts.
  for (const auto dtype : {torch::kFloat, torch::kBFloat16})
    for (const auto kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam})
      for (const bool amsgrad : {false, true})
        for (const WeightUpdate rule : {WeightUpdate::kNearest, WeightUpdate::kStochastic, WeightUpdate::kKahan}) {
          if (dtype == torch::kFloat && rule != WeightUpdate::kNearest) continue;  // fp32 rounds by no rule
          SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + optimizer_name(kind) + (amsgrad ? " amsgrad " : " ") +
                       amp::weight_update_name(rule));
          torch::manual_seed(21);
          const auto base = [&](double scale) { return (torch::randn({257, 300}) * scale).to(dtype); };
          const int64_t n_state = amsgrad ? 3 : 2;
          // Strided: views of [257, 300] bases, transposed; fused: contiguous copies of the same.
          torch::Tensor w_base = base(1.0);
          std::vector<torch::Tensor> st_base;
          for (int64_t i = 0; i < n_state; ++i) st_base.push_back(torch::zeros({257, 300}, dtype));
          torch::Tensor comp_base = torch::zeros({257, 300}, dtype);
          torch::Tensor w = w_base.t().contiguous(), comp = comp_base.t().contiguous();
          torch::Tensor w_scalar = w.clone(), comp_scalar = comp.clone();
          std::vector<torch::Tensor> st, st_scalar;
          for (const auto& t : st_base) st.push_back(t.t().contiguous());
          for (const auto& t : st) st_scalar.push_back(t.clone());
          const bool kahan = dtype == torch::kBFloat16 && rule == WeightUpdate::kKahan;
          for (int64_t step = 1; step <= 3; ++step) {
            const torch::Tensor g = base(std::pow(10.0, -step)).t().contiguous();
            std::vector<torch::Tensor> strided_state;
            for (const auto& t : st_base) strided_state.push_back(t.t());
            ASSERT_FALSE(w_base.t().is_contiguous());
            const amp::LostUpdates a = adam_core_step(w_base.t(), g.t().contiguous().t(), strided_state,
                                                      kahan ? comp_base.t() : torch::Tensor(), kind, amsgrad, rule, step);
            const amp::LostUpdates b =
                adam_core_step(w, g, st, kahan ? comp : torch::Tensor(), kind, amsgrad, rule, step);
            ASSERT_EQ(optim::cpu_pass_vectorized(), compat::cpu_has_avx2_fma());
            ::setenv("MIXTRAIN_CPU_AVX2", "0", 1);
            ASSERT_FALSE(optim::cpu_pass_vectorized());  // else both runs would take one path
            const amp::LostUpdates c =
                adam_core_step(w_scalar, g, st_scalar, kahan ? comp_scalar : torch::Tensor(), kind, amsgrad, rule, step);
            ::unsetenv("MIXTRAIN_CPU_AVX2");
            ASSERT_TRUE(torch::equal(w_base.t(), w)) << "step " << step;
            ASSERT_TRUE(torch::equal(w_scalar, w)) << "step " << step;
            for (int64_t i = 0; i < n_state; ++i) {
              ASSERT_TRUE(torch::equal(st_base[i].t(), st[i])) << "state " << i;
              ASSERT_TRUE(torch::equal(st_scalar[i], st[i])) << "state " << i;
            }
            if (kahan) ASSERT_TRUE(torch::equal(comp_base.t(), comp) && torch::equal(comp_scalar, comp));
            for (const amp::LostUpdates* other : {&a, &c}) {
              EXPECT_EQ(other->elements, b.elements);
              EXPECT_EQ(other->intended, b.intended);
              EXPECT_EQ(other->lost, b.lost);
              EXPECT_EQ(other->intended_sq, b.intended_sq);
              EXPECT_EQ(other->lost_sq, b.lost_sq);
            }
          }
          EXPECT_FALSE(torch::equal(w.to(torch::kFloat), base(1.0).t().to(torch::kFloat)));  // it moved
        }
}

TEST_F(RoundedOptimizersTest, ManyParametersInOnePassAreEachStepAloneBitwiseAndCheckedBeforeAnyMoves) {
  // update_parameters shares one parallel region between the fused Adam pass's parameters
  // and steps the rest (here a transposed view: torch's ops) one by one. Each parameter's
  // weight, state and counts are update_parameter's on it alone, at any thread count.
  const int before_threads = at::get_num_threads();
  for (const WeightUpdate rule : {WeightUpdate::kNearest, WeightUpdate::kStochastic}) {
    SCOPED_TRACE(amp::weight_update_name(rule));
    torch::manual_seed(5);
    // fp32 and bf16, large (several pieces, a ragged tail) and tiny, and one strided.
    std::vector<torch::Tensor> weights = {torch::randn({kBig}), torch::randn({kBig}).to(torch::kBFloat16),
                                          torch::randn({7}).to(torch::kBFloat16), torch::randn({3}),
                                          torch::randn({40, 33}).t()};
    const auto copies = [&] {
      std::vector<optim::ParamStep> out;
      for (size_t i = 0; i < weights.size(); ++i) {
        optim::ParamStep s;
        s.param = weights[i].is_contiguous() ? weights[i].clone() : weights[i].t().clone().t();
        s.state = {torch::zeros_like(s.param), torch::zeros_like(s.param)};
        s.stream = 1000 + i;
        out.push_back(s);
      }
      return out;
    };
    std::vector<optim::ParamStep> together = copies(), alone = copies();
    ASSERT_FALSE(together.back().param.is_contiguous());
    optim::UpdateRule r;
    r.kind = OptimizerKind::kAdamW;
    r.lr = 1e-3;
    r.weight_decay = 0.01;
    for (int64_t step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < weights.size(); ++i) {
        const torch::Tensor g = (torch::randn(weights[i].sizes()) * 1e-3).to(weights[i].scalar_type());
        for (auto* list : {&together, &alone}) {
          (*list)[i].grad = g;
          (*list)[i].step = step;
        }
      }
      at::set_num_threads(2);
      const std::vector<amp::LostUpdates> counts = optim::update_parameters(r, together, rule, 7);
      at::set_num_threads(1);
      ASSERT_EQ(counts.size(), weights.size());
      for (size_t i = 0; i < weights.size(); ++i) {
        SCOPED_TRACE("parameter " + std::to_string(i) + ", step " + std::to_string(step));
        const amp::LostUpdates one = optim::update_parameter(r, alone[i], rule, 7);
        ASSERT_TRUE(torch::equal(together[i].param, alone[i].param));
        ASSERT_TRUE(torch::equal(together[i].state[0], alone[i].state[0]));
        ASSERT_TRUE(torch::equal(together[i].state[1], alone[i].state[1]));
        EXPECT_EQ(counts[i].elements, one.elements);
        EXPECT_EQ(counts[i].intended, one.intended);
        EXPECT_EQ(counts[i].lost, one.lost);
        EXPECT_EQ(counts[i].intended_sq, one.intended_sq);
        EXPECT_EQ(counts[i].lost_sq, one.lost_sq);
      }
    }
    // The bf16 weights rounded something under nearest (tiny steps), and not the fp32 ones.
    if (rule == WeightUpdate::kNearest) EXPECT_GT(optim::update_parameter(r, alone[1], rule, 7).lost, 0);
  }
  at::set_num_threads(before_threads);

  // A step that fails its check moves no weight, not even the ones listed before it.
  std::vector<optim::ParamStep> steps(2);
  for (auto& s : steps) {
    s.param = torch::randn({10});
    s.grad = torch::randn({10});
    s.state = {torch::zeros({10}), torch::zeros({10})};
  }
  steps[1].grad = torch::randn({9});
  const torch::Tensor first = steps[0].param.clone();
  optim::UpdateRule r;
  r.kind = OptimizerKind::kAdamW;
  expect_one_line_error([&] { optim::update_parameters(r, steps, WeightUpdate::kNearest, 0); },
                        "the gradient must be a floating-point tensor of the parameter's shape");
  EXPECT_TRUE(torch::equal(steps[0].param, first));
}

TEST_F(RoundedOptimizersTest, TheCoresRootIsCorrectlyRounded) {
  // Adagrad's step from sums x, with a gradient of 1, lr 1 and eps 0, writes -1 / sqrt(x + 1).
  // Against the root taken in double and rounded once (correct for a float), over 2^16 sums: the
  // core's root is IEEE's, not MKL's (on AVX-512 CPUs an ulp off in about 17% of these).
  torch::manual_seed(5);
  const torch::Tensor x = torch::rand({1 << 16}) * 100 + 1;
  const torch::Tensor g = torch::ones({1 << 16});
  const torch::Tensor sum = x + 1;
  const torch::Tensor expected = -(1 / sum.to(torch::kDouble).sqrt().to(torch::kFloat));
  torch::Tensor w = torch::zeros({1 << 16});
  optim::UpdateRule r;
  r.kind = OptimizerKind::kAdagrad;
  r.lr = 1;
  r.eps = 0;
  optim::ParamStep s;
  s.param = w;
  s.grad = g;
  s.state = {x.clone()};
  optim::update_parameter(r, s, WeightUpdate::kNearest, 0);
  EXPECT_TRUE(torch::equal(s.state[0], sum));
  EXPECT_TRUE(torch::equal(w, expected));
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
