#include "mixtrain/callbacks/gan.h"

#include "mixtrain/core/precision_callback.h"
#include "mixtrain/core/learner.h"

#include <torch/autograd.h>

namespace mixtrain::callbacks {

GANTrainer::GANTrainer(Model generator, int64_t noise_dim, OptimizerFactory generator_opt, double generator_lr,
                       uint64_t seed)
    : generator_(std::move(generator)), noise_dim_(noise_dim),
      noise_gen_(at::detail::createCPUGenerator(seed)) {
  TORCH_CHECK(noise_dim > 0, "Invalid noise_dim: ", noise_dim, " (must be > 0)");
  TORCH_CHECK(generator_lr > 0, "Invalid generator_lr: ", generator_lr, " (must be > 0)");
  std::vector<torch::Tensor> params;
  for (const auto& p : generator_.module().parameters())
    if (p.requires_grad()) params.push_back(p);
  generator_opt_ = generator_opt(params, generator_lr);
  TORCH_CHECK(generator_opt_, "GANTrainer: the generator's optimizer factory returned nothing");
  order = 15;
}

torch::Tensor GANTrainer::sample(int64_t n) {
  torch::NoGradGuard no_grad;
  generator_.module().eval();
  torch::Tensor z = torch::randn({n, noise_dim_}, noise_gen_);
  torch::Tensor out = generator_(z.to(generator_.module().parameters().front().device())).to(torch::kFloat);
  generator_.module().train();
  return out;
}

void GANTrainer::before_fit(Learner& learn) { generator_.module().to(learn.device()); }

void GANTrainer::after_pred(Learner& learn) {
  if (!learn.training()) return;
  const int64_t bs = learn.batch().size();
  torch::Tensor z = torch::randn({bs, noise_dim_}, noise_gen_).to(learn.device());
  torch::Tensor fake = generator_(z);
  Model& critic = learn.model();
  pred_fake_for_critic_ = critic(fake.detach()).to(torch::kFloat);
  pred_fake_for_generator_ = critic(fake).to(torch::kFloat);
}

void GANTrainer::after_loss(Learner& learn) {
  if (!learn.training()) return;
  const torch::Tensor& real_pred = learn.pred();
  const torch::Tensor ones = torch::ones_like(real_pred), zeros = torch::zeros_like(real_pred);
  learn.loss_grad() = learn.loss_fn()(real_pred, ones) + learn.loss_fn()(pred_fake_for_critic_, zeros);
  learn.loss() = learn.loss_grad().detach().clone();
  generator_loss_ = learn.loss_fn()(pred_fake_for_generator_, torch::ones_like(pred_fake_for_generator_));
}

void GANTrainer::after_backward(Learner& learn) {
  if (!learn.training()) return;
  // The generator's loss is scaled and its optimizer stepped by the same GradScaler,
  // so both optimizers' checks feed one update().
  const auto pc = learn.precision_cb();
  torch::Tensor loss = pc ? pc->scale_extra_loss(generator_loss_) : generator_loss_;
  std::vector<torch::Tensor> params;
  for (auto& group : generator_opt_->param_groups())
    for (auto& p : group.params()) params.push_back(p);
  // autograd::grad, not backward(): the critic's .grad holds the critic's own
  // gradients, which the Learner is about to step.
  auto grads = torch::autograd::grad({loss}, params, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                     /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    // zero_grad() detaches .grad in place, which a view (e.g. an expanded bias
    // gradient) does not allow: own a plain tensor in that case.
    params[i].mutable_grad() = grads[i].is_view() ? grads[i].clone() : grads[i];
  }
  const bool stepped = pc ? pc->step_extra_optimizer(*generator_opt_) : (generator_opt_->step(), true);
  generator_opt_->zero_grad();
  generator_losses_.push_back(generator_loss_.item<double>());
  generator_skipped_.push_back(!stepped);
}

void GANTrainer::after_batch(Learner&) {
  pred_fake_for_critic_ = pred_fake_for_generator_ = generator_loss_ = torch::Tensor();
}

} // namespace mixtrain::callbacks
