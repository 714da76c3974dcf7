#pragma once
// Moved to <mixtrain/util/atomic_file.h> in 0.2.0; this forwarding header goes in 0.3.0 (CHANGELOG.md).
#include "mixtrain/util/atomic_file.h"
