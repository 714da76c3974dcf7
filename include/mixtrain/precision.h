#pragma once
// Split in 0.2.0 into <mixtrain/core/precision.h> (the Precision vocabulary) and
// <mixtrain/amp/precision_options.h> (PrecisionOptions and the callbacks that make
// each mode); this forwarding header goes in 0.3.0 (CHANGELOG.md).
#include "mixtrain/amp/precision_options.h"
#include "mixtrain/core/precision.h"
