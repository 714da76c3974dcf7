#pragma once
// Moved to <mixtrain/models/module_scope.h> in 0.2.0; this forwarding header goes in 0.3.0 (CHANGELOG.md).
#include "mixtrain/models/module_scope.h"
