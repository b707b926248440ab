// The checking device as a plugin module: cszoo loads it with --plugin_paths/--python_paths and
// it registers the device "check" when loaded, so `device: check` runs a Trainer on it.
#include "support/checking_device.h"

namespace {
const bool registered = (cstorch::testing::register_checking_device(), true);
}
