// The table of precision modes (mixtrain/core/precision_modes.h): one row per mode, and
// the lookups every layer asks instead of switching on the mode.
#include "mixtrain/core/precision_modes.h"

#include "mixtrain/util/option_error.h"
#include "mixtrain/util/phrase.h"

#include <c10/util/Exception.h>

#include <vector>

namespace mixtrain {

const std::vector<PrecisionMode>& precision_modes() {
  using c10::ScalarType;
  constexpr const char* kNoHalfMatmul = "libtorch has no CPU half matmul";
  // Columns after the name: summary, api_call, compute, then autocast, grad_scaler,
  // scales_loss, master_weights, pure, traces_overflow, cpu_refusal, cpu_note,
  // doctor_compares, fit_warning, takes_islands.
  static const std::vector<PrecisionMode> kModes = {
      {Precision::kFp32, "fp32", "full precision", "to_fp32()", ScalarType::Float,  //
       false, false, false, false, false, false, nullptr, nullptr, false, false, false},
      {Precision::kFp16, "fp16", "autocast + dynamic loss scaling; emulated on CPU", "to_fp16()", ScalarType::Half,  //
       true, true, true, false, false, true, nullptr, "emulated on CPU", true, true, true},
      {Precision::kBf16, "bf16", "autocast, no scaler", "to_bf16()", ScalarType::BFloat16,  //
       true, false, false, false, false, false, nullptr, nullptr, true, false, true},
      {Precision::kFp16Master, "fp16-master", "model stored in fp16, fp32 master weights, norm layers fp32; needs CUDA",
       "to_half()", ScalarType::Half,  //
       false, false, true, true, false, true, kNoHalfMatmul, nullptr, false, false, true},
      {Precision::kBf16Master, "bf16-master", "model stored in bf16, fp32 master weights, norm layers fp32",
       "to_half(MasterWeightsOptions().dtype(kBFloat16))", ScalarType::BFloat16,  //
       false, false, true, true, false, false, nullptr, nullptr, false, false, true},
      {Precision::kBf16Pure, "bf16-pure",
       "weights, gradients and optimizer state bf16, no fp32 copy; each update computed in fp32 and rounded once by "
       "--weight-update",
       "set_precision(Precision::kBf16Pure)", ScalarType::BFloat16,  //
       false, false, false, false, true, false, nullptr, nullptr, true, true, true},
  };
  return kModes;
}

const PrecisionMode& mode_of(Precision precision) {
  for (const auto& m : precision_modes())
    if (m.precision == precision) return m;
  TORCH_INTERNAL_ASSERT(false, "unknown Precision ", static_cast<int>(precision));
}

std::vector<Precision> modes_where(bool PrecisionMode::*flag) {
  std::vector<Precision> out;
  for (const auto& m : precision_modes())
    if (m.*flag) out.push_back(m.precision);
  return out;
}

std::string mode_names(const std::vector<Precision>& modes, const std::string& last, std::optional<Precision> marked) {
  std::string out;
  for (size_t i = 0; i < modes.size(); ++i)
    out += (i == 0 ? "" : i + 1 == modes.size() ? last : ", ") + std::string(mode_of(modes[i]).name) +
           (modes[i] == marked ? " (default)" : "");
  return out;
}

std::string mode_summaries() {
  std::string out;
  for (const auto& m : precision_modes()) out += (out.empty() ? "" : ", ") + std::string(m.name) + " (" + m.summary + ")";
  return out;
}

void check_mode_runs_on(Precision precision, bool device_is_cpu) {
  const PrecisionMode& mode = mode_of(precision);
  if (!device_is_cpu || !mode.cpu_refusal) return;
  // Instead: the same storage in a dtype the CPU computes, then the autocast mode of the
  // same compute dtype (how the CPU runs it said, where the table says it).
  Phrase instead;
  for (const auto& m : precision_modes())
    if (!m.cpu_refusal && m.master_weights == mode.master_weights && m.pure == mode.pure && m.compute != mode.compute)
      instead += Phrase(instead.empty() ? "" : ", or ") + Phrase::setting("precision", m.name);
  for (const auto& m : precision_modes())
    if (!m.cpu_refusal && m.autocast && m.compute == mode.compute)
      instead += Phrase(instead.empty() ? "" : ", or ") + Phrase::setting("precision", m.name) +
                 (m.cpu_note ? " (" + std::string(m.cpu_note) + ")" : std::string());
  throw OptionError("precision", Phrase::name("precision") + " " + mode.name + " needs CUDA (" + mode.cpu_refusal + ")" +
                                     (instead.empty() ? Phrase() : "; use " + instead));
}

} // namespace mixtrain
