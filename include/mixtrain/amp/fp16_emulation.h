#pragma once
// Moved to <mixtrain/amp/reduced_precision_emulation.h> in 0.2.0; this forwarding header goes in 0.3.0 (CHANGELOG.md).
#include "mixtrain/amp/reduced_precision_emulation.h"
#include "mixtrain/deprecated.h"
