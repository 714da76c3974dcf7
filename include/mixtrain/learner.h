#pragma once
// Moved to <mixtrain/core/learner.h> in 0.2.0; this forwarding header goes in 0.3.0 (CHANGELOG.md).
#include "mixtrain/core/learner.h"
