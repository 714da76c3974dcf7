#pragma once
/// Umbrella header: everything a training program needs.

#include "mixtrain/callback.h"
#include "mixtrain/callbacks/csv_logger.h"
#include "mixtrain/callbacks/progress.h"
#include "mixtrain/callbacks/summary_writer.h"
#include "mixtrain/data.h"
#include "mixtrain/learner.h"
#include "mixtrain/metrics.h"
#include "mixtrain/models.h"
#include "mixtrain/recorder.h"
#include "mixtrain/schedule.h"
#include "mixtrain/threads.h"
