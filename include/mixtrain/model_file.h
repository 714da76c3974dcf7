#pragma once
// Moved to <mixtrain/run/model_file.h> in 0.2.0; this forwarding header goes in 0.3.0 (CHANGELOG.md).
#include "mixtrain/run/model_file.h"
