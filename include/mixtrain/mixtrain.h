#pragma once
/// Umbrella header: everything a training program needs.

#include "mixtrain/amp/autocast.h"
#include "mixtrain/amp/grad_scaler.h"
#include "mixtrain/amp/mixed_precision.h"
#include "mixtrain/amp/unscale.h"
#include "mixtrain/callback.h"
#include "mixtrain/callbacks/csv_logger.h"
#include "mixtrain/callbacks/gradient_clip.h"
#include "mixtrain/callbacks/progress.h"
#include "mixtrain/callbacks/summary_writer.h"
#include "mixtrain/data.h"
#include "mixtrain/learner.h"
#include "mixtrain/metrics.h"
#include "mixtrain/models.h"
#include "mixtrain/recorder.h"
#include "mixtrain/schedule.h"
#include "mixtrain/threads.h"
