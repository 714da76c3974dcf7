// CUDA autocast's op lists, as torch 2.x defines them (aten/src/ATen/autocast_mode.h,
// the macros AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE
// and AT_FORALL_PROMOTE; cat, stack and index_copy are registered as promote in
// autocast_mode.cpp). Ops are matched by schema name, so every overload of a listed
// op counts. A few names only older releases list (cudnn_convolution*, the private
// _softmax/_log_softmax and native_layer_norm that the listed ops call) are kept so
// that the decompositions of releases before torch 2.x (libtorch 1.13, supported until 0.2.0)
// are classified the same way.
#include "mixtrain/amp/op_trace.h"

#include <unordered_map>

namespace mixtrain::amp {

AutocastList autocast_list(const std::string& op_name) {
  static const std::unordered_map<std::string, AutocastList> kLists = [] {
    std::unordered_map<std::string, AutocastList> m;
    for (const char* op :
         {"_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
          "conv_transpose3d", "convolution", "cudnn_convolution", "cudnn_convolution_transpose", "prelu", "addmm",
          "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm",
          "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell",
          "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
          "scaled_dot_product_attention", "_scaled_dot_product_attention",
          // Whole RNNs: CUDA runs nn.LSTM / nn.GRU / nn.RNN through cuDNN's _cudnn_rnn, on the
          // fp16 list (input, hidden state and weights cast to half, a half result). A CPU
          // never calls it: aten::lstm decomposes into cells here, so the RNN op itself is
          // classified as the GPU's _cudnn_rnn is (its inner calls then run unrounded).
          "_cudnn_rnn", "lstm", "gru", "rnn_tanh", "rnn_relu"})
      m[std::string("aten::") + op] = AutocastList::kLowerPrecision;
    for (const char* op :
         {"acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
          "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm",
          "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
          "nll_loss_nd", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
          "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
          "multi_margin_loss", "binary_cross_entropy_with_logits", "cross_entropy_loss", "dist", "pdist", "cdist",
          "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
          "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d",
          "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d",
          "_upsample_bicubic2d_aa",
          // AT_FORALL_FP32_SET_OPT_DTYPE
          "prod", "softmax", "log_softmax", "_softmax", "_log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
          "linalg_matrix_norm", "sum", "norm"})
      m[std::string("aten::") + op] = AutocastList::kFp32;
    for (const char* op : {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
                           "index_put", "tensordot", "scatter_add", "cat", "stack", "index_copy"})
      m[std::string("aten::") + op] = AutocastList::kPromote;
    return m;
  }();
  const auto it = kLists.find(op_name);
  return it == kLists.end() ? AutocastList::kNone : it->second;
}

} // namespace mixtrain::amp
