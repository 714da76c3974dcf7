#pragma once
/// The optimizer core: one parameter's step of the five optimizers (AdamW, Adam with
/// amsgrad, SGD with momentum/dampening/nesterov, RMSprop, Adagrad) over a weight,
/// gradient and state stored in any floating dtype (fp32, bf16, fp16), computed in
/// fp32 and written back once:
///   - the weight by the rule (amp/weight_update.h: nearest, stochastic, Kahan), with the
///     updates rounding threw away counted in the same pass;
///   - the state to nearest, in its own dtype.
///
/// The update is torch.optim's single-tensor arithmetic in fp32, element for element, with
/// one difference: the square root is correctly rounded (IEEE's, as CUDA and torch's fused
/// CPU kernels take it). torch's CPU sqrt is MKL's, an ulp off in about 17% of elements on
/// AVX-512 CPUs (correct on AVX2 ones); a fused pass cannot give MKL's bits, and leaving the
/// root to ATen cost more than torch's whole fused step. So the core is bitwise torch.optim's
/// step run with a correctly rounded root, and within 4 ulps (of the larger of the weight and
/// its update) of torch's own step from the same state; what the root does not reach (Adam's
/// moments, RMSprop's square_avg, Adagrad's sum) is bitwise (tests/python/test_optim.py).
///   - Adam and AdamW on contiguous CPU tensors of fp32 and bf16 (the moments in one dtype):
///     one fused pass (AVX2+FMA where the CPU has them, the same arithmetic element by element
///     otherwise) that reads each tensor once and writes it once; a bf16 weight's span is
///     rounded and counted by amp::round_update_span as below;
///   - all-fp32 storage otherwise runs torch's ops on the tensors in place;
///   - any 16-bit tensor runs them on fp32 copies of one chunk (4 x amp::kUpdateChunk =
///     131072 elements: fewer dispatches, still in cache) at a time, chunks in parallel,
///     and writes each chunk back once, its rounding counted in amp::kUpdateChunk spans
///     summed in order (round_update's counts, bit for bit). Every op
///     is elementwise, so a chunk's numbers are the whole tensor's: bitwise the same
///     ops on fp32 tensors holding the 16-bit values, rounded after (tested). The fp32
///     temporaries are a few chunks, not a copy of the model.
///
/// The C++ optimizers (optim/optimizers.h) and Python's mixtrain.optim both step through
/// here, a param group at a time (update_parameters): the fused pass then shares one
/// parallel region between all the group's parameters instead of starting one a tensor.
///
/// Example (one parameter, AdamW, bf16 storage):
///   mixtrain::optim::UpdateRule rule;
///   rule.kind = mixtrain::OptimizerKind::kAdamW;
///   rule.lr = 1e-4;
///   mixtrain::optim::ParamStep s{w, w.grad(), {exp_avg, exp_avg_sq}};
///   s.step = ++steps;
///   auto lost = mixtrain::optim::update_parameter(rule, s, mixtrain::amp::WeightUpdate::kStochastic, /*seed=*/0);

#include "mixtrain/amp/weight_update.h"
#include "mixtrain/core/optimizers.h"

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain::optim {

/// One parameter group's hyper-parameters, in torch.optim's names. Each kind reads its own.
struct UpdateRule {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;  ///< Adam, AdamW
  double eps = 1e-8;                  ///< Adam, AdamW, RMSprop, Adagrad
  double weight_decay = 0;            ///< decoupled for AdamW, added to the gradient for the others
  bool amsgrad = false;               ///< Adam, AdamW
  double momentum = 0;                ///< SGD, RMSprop
  double dampening = 0;               ///< SGD
  bool nesterov = false;              ///< SGD
  double alpha = 0.99;                ///< RMSprop's smoothing
  bool centered = false;              ///< RMSprop
  double lr_decay = 0;                ///< Adagrad
  bool maximize = false;              ///< ascend instead (Python's maximize=True)
};

/// The state tensors the rule keeps per parameter, in ParamStep::state's order, by
/// torch.optim's state_dict names: Adam exp_avg, exp_avg_sq (+ max_exp_avg_sq);
/// SGD momentum_buffer (with momentum); RMSprop square_avg (+ momentum_buffer,
/// + grad_avg when centered); Adagrad sum.
std::vector<std::string> state_names(const UpdateRule& rule);

/// Whether the core's CPU passes (the fused Adam pass, its square root, bf16 stores) run
/// their AVX2+FMA loops in this process now: the CPU has them and MIXTRAIN_CPU_AVX2 is not
/// "0". Otherwise they run the same arithmetic one element at a time, to the same bits, so
/// this changes no result: it says which code a report or a test exercised.
bool cpu_pass_vectorized();

/// One parameter's step.
struct ParamStep {
  torch::Tensor param;               ///< updated in place; any floating dtype, any device
  torch::Tensor grad;                ///< its gradient, same shape (any floating dtype)
  std::vector<torch::Tensor> state;  ///< state_names(rule)'s tensors, all defined, each the param's shape
  torch::Tensor compensation;        ///< kahan on a bf16 weight: the parameter's shape (bf16 or fp32); else undefined
  int64_t step = 1;                  ///< this step's count, from 1: Adam's bias correction, Adagrad's decay
  bool fresh_momentum = false;       ///< SGD: the buffer takes the gradient as it is (torch's first momentum step)
  uint64_t stream = 0;               ///< stochastic rounding's stream (with the seed): one per parameter and step
};

/// Steps `s.param` (and its state) by `rule`, writing the weight back by `weight_update`.
/// An fp32 weight takes the fp32 result as it is (nothing is rounded, nothing counted
/// but its elements); a bf16 weight by the rule; an fp16 weight only by kNearest.
/// Throws c10::Error (one line) for shapes that do not match, state the rule does not
/// keep, a missing Kahan compensation, or an fp16 weight with another rule.
amp::LostUpdates update_parameter(const UpdateRule& rule, ParamStep& s, amp::WeightUpdate weight_update, uint64_t seed);

/// update_parameter on each of `steps` (distinct parameters), as one pass: Adam and AdamW
/// on contiguous CPU fp32/bf16 tensors share one parallel region for them all, which is
/// what a step of many tensors spends least on. Each parameter's numbers and counts are
/// bitwise update_parameter's on it alone. Every step is checked before any weight moves.
std::vector<amp::LostUpdates> update_parameters(const UpdateRule& rule, std::vector<ParamStep>& steps,
                                                amp::WeightUpdate weight_update, uint64_t seed);

} // namespace mixtrain::optim
