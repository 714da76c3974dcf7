#include "mixtrain/util/malloc_settings.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace mixtrain {

namespace {

bool under_address_sanitizer() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

bool settle_once() {
#if defined(__GLIBC__)
  if (under_address_sanitizer()) return false;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && (std::strstr(tunables, "mmap_threshold") || std::strstr(tunables, "trim_threshold"))) return false;
  // glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, and the trim threshold it slides to
  // beside it (twice the mmap threshold). Setting either stops the sliding of both, so
  // both are set.
  constexpr int kMmapThreshold = 32 * 1024 * 1024;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, 2 * kMmapThreshold) == 1;
#else
  return false;
#endif
}

} // namespace

bool settle_malloc_for_training() {
  static const bool settled = settle_once();
  return settled;
}

} // namespace mixtrain
