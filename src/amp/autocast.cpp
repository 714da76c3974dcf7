#include "mixtrain/amp/autocast.h"

#include "mixtrain/compat.h"

namespace mixtrain::amp {

autocast::autocast(c10::DeviceType device, c10::ScalarType dtype, bool enabled, bool cache_enabled)
    : device_(device), prev_enabled_(compat::is_autocast_enabled(device)),
      prev_dtype_(compat::get_autocast_dtype(device)), prev_cache_enabled_(compat::is_autocast_cache_enabled()) {
  compat::set_autocast_enabled(device, enabled);
  compat::set_autocast_dtype(device, dtype);
  compat::set_autocast_cache_enabled(cache_enabled);
  compat::increment_nesting();
}

autocast::~autocast() {
  if (compat::decrement_nesting() == 0) compat::clear_autocast_cache();
  compat::set_autocast_enabled(device_, prev_enabled_);
  compat::set_autocast_dtype(device_, prev_dtype_);
  compat::set_autocast_cache_enabled(prev_cache_enabled_);
}


} // namespace mixtrain::amp
