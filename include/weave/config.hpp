// Compile-time maxima; the actual world size and SM count always come from the runtime.
#pragma once

namespace weave {
inline constexpr int kMaxWorld = 8;  // ranks in one NVLink domain a device view can address
}
