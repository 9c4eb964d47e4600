// Range checks of the numbers read from a Hugging Face config.json, named by its keys: a value no
// real model has (an epsilon of 1e300, a negative routing scale, a zero latent rank) is refused
// while the folder is read, instead of converting with rc 0 and producing NaN later.
#pragma once

#include "titan/common/check.h"

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

namespace titan::hf {

// `value` of config.json's `key` must be finite and in [lo, hi] ((lo, hi] when lo_open).
inline void check_number(const std::string& key, double value, double lo, double hi,
                         bool lo_open = false) {
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) && value <= hi;
  if (ok) return;
  std::ostringstream os;
  os << "config.json \"" << key << "\" must be a finite number in " << (lo_open ? "(" : "[") << lo
     << ", " << hi << "], got " << value;
  throw ConfigError(os.str());
}

// `value` of config.json's `key` must be in [lo, hi]; `why` says what it is, for the message.
inline void check_int(const std::string& key, int64_t value, int64_t lo, int64_t hi,
                      const std::string& why = "") {
  if (value >= lo && value <= hi) return;
  throw ConfigError(message("config.json \"", key, "\" must be in [", lo, ", ", hi, "], got ",
                            value, (why.empty() ? "" : " (" + why + ")")));
}

}  // namespace titan::hf
