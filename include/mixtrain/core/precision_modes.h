#pragma once
/// Every precision mode described once: its name, what it computes in, and what each
/// part of mixtrain does with it (the scaler, master weights, the doctor, the fit
/// warning, fp32 islands, the CPU). The names and properties in precision.h, the help
/// texts, the option table's mode lists, the doctor's accepted modes and its overflow
/// tracing, the CPU checks and the fit warning all read this table, so a new mode is
/// one row (and its Precision constant).
#include "mixtrain/core/precision.h"

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <vector>

namespace mixtrain {

struct PrecisionMode {
  Precision precision;
  const char* name;          ///< "bf16-pure": the CLI's, args.json's and Python's
  const char* summary;       ///< what --precision's help says of it
  const char* api_call;      ///< the Learner call that sets it ("to_fp16()")
  c10::ScalarType compute;   ///< what the model computes in
  bool autocast;             ///< the forward runs under autocast: the CPU's support is checked before a run
  bool grad_scaler;          ///< fp16's dynamic GradScaler (GradScalerOptions, its init_scale/growth trials, the bf16 alternative)
  bool scales_loss;          ///< fp16's GradScaler, or the masters' loss scale
  bool master_weights;       ///< 16-bit weights with an fp32 master copy
  bool pure;                 ///< 16-bit weights without an fp32 copy
  bool traces_overflow;      ///< fp16 compute: the doctor traces a forward overflow to its op, in its evidence and trials
  const char* cpu_refusal;   ///< why it cannot train on a CPU ("libtorch has no CPU half matmul"), or nullptr
  const char* cpu_note;      ///< how the CPU runs it, where that is worth saying ("emulated on CPU"), or nullptr
  bool doctor_compares;      ///< the doctor compares it with fp32 from scratch and from a loop (a run's checkpoint in any mixed mode is replayed as it trained)
  bool fit_warning;          ///< a fit in it ends with the skips / lost-updates warning
  bool takes_islands;        ///< keep_fp32 applies (every mode but fp32)
};

/// The table, in the order help lists the modes.
const std::vector<PrecisionMode>& precision_modes();
/// The row of `precision`.
const PrecisionMode& mode_of(Precision precision);
/// The modes whose `flag` holds, in the table's order.
std::vector<Precision> modes_where(bool PrecisionMode::*flag);
/// Names joined for a sentence: "fp16, bf16 or bf16-pure" (`last` joins the last two),
/// `marked` followed by " (default)" where it is listed.
std::string mode_names(const std::vector<Precision>& modes, const std::string& last = " or ",
                       std::optional<Precision> marked = std::nullopt);
/// Every mode with its summary, for --precision's help: "fp32 (full precision), fp16 (...)".
std::string mode_summaries();
/// Throws OptionError("precision") when `precision` cannot train on `device` (its
/// cpu_refusal), naming what to use instead.
void check_mode_runs_on(Precision precision, bool device_is_cpu);

} // namespace mixtrain
