#pragma once
/// Every precision mode described once: its name, what it computes in, and what each
/// part of mixtrain does with it (the scaler, master weights, the doctor, the fit
/// warning, fp32 islands). The names and properties in precision.h, the option table's
/// mode lists, the doctor's accepted modes and the fit warning all read this table, so
/// a new mode is one row.
#include "mixtrain/core/precision.h"

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace mixtrain {

struct PrecisionMode {
  Precision precision;
  const char* name;          ///< "bf16-pure": the CLI's, args.json's and Python's
  c10::ScalarType compute;   ///< what the model computes in
  bool scales_loss;          ///< fp16's GradScaler, or the masters' loss scale
  bool master_weights;       ///< 16-bit weights with an fp32 master copy
  bool pure;                 ///< 16-bit weights without an fp32 copy
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

} // namespace mixtrain
