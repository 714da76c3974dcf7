#pragma once
/// GAN training with one Learner: two models, two optimizers, mixed precision.
/// fastai documents to_fp16 as broken for GANs; here each optimizer gets its own
/// unscale and skip from the shared GradScaler, with one update per batch.

#include "mixtrain/core/callback.h"
#include "mixtrain/core/learner.h"

#include <memory>
#include <vector>

namespace mixtrain::callbacks {

/// Turns a Learner whose model is the critic (discriminator) into a GAN trainer.
/// The Learner's data are real samples; its loss_fn is applied as
/// loss_fn(logits, labels) with float labels 1 (real) and 0 (fake), e.g.
/// binary_cross_entropy_with_logits. Every training batch:
///   after_pred     fake = G(z); the critic also scores fake.detach() (for its loss)
///                  and fake (for the generator's loss), inside the forward region
///                  (autocast or fp16 emulation) that MixedPrecision opened;
///   after_loss     critic loss = loss(D(real), 1) + loss(D(fake), 0);
///                  generator loss = loss(D(fake), 1);
///   after_backward the generator's gradients are taken with autograd::grad (the
///                  critic's .grad is untouched), scaled by the shared GradScaler
///                  when one is in use, and the generator's optimizer steps or
///                  skips on its own inf/NaN check;
///   the Learner then steps the critic's optimizer (MixedPrecision checks it),
///   and MixedPrecision's single update() sees both optimizers' checks.
/// Both models score the same batch (simultaneous updates).
/// Order 15: after MixedPrecision (10) opened the forward region and cast preds.
class GANTrainer : public Callback {
 public:
  GANTrainer(Model generator, int64_t noise_dim, OptimizerFactory generator_opt, double generator_lr,
             uint64_t seed = 0);
  std::string name() const override { return "GANTrainer"; }

  Model& generator() { return generator_; }
  torch::optim::Optimizer& generator_opt() { return *generator_opt_; }
  /// Generator loss per training batch.
  const std::vector<double>& generator_losses() const { return generator_losses_; }
  /// Whether the generator's step was skipped (overflow), per training batch.
  const std::vector<bool>& generator_skipped() const { return generator_skipped_; }
  /// `n` samples from the generator (no grad, fp32).
  torch::Tensor sample(int64_t n);

  void before_fit(Learner& learn) override;
  void after_pred(Learner& learn) override;
  void after_loss(Learner& learn) override;
  void after_backward(Learner& learn) override;
  void after_batch(Learner& learn) override;

 private:
  Model generator_;
  int64_t noise_dim_;
  std::unique_ptr<torch::optim::Optimizer> generator_opt_;
  at::Generator noise_gen_;
  torch::Tensor pred_fake_for_critic_, pred_fake_for_generator_, generator_loss_;
  std::vector<double> generator_losses_;
  std::vector<bool> generator_skipped_;
};

} // namespace mixtrain::callbacks
