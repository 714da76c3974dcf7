#pragma once
// Moved to <mixtrain/core/precision_callback.h> in 0.2.0; this forwarding header goes in 0.3.0 (CHANGELOG.md).
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/deprecated.h"
