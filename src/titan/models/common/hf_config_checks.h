// Range checks of the numbers read from a Hugging Face config.json, named by its keys: a value no
// real model has (an epsilon of 1e300, a negative routing scale, a zero latent rank) is refused
// while the folder is read, instead of converting with rc 0 and producing NaN later.
#pragma once

#include "titan/common/check.h"

#include <nlohmann/json.hpp>

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

// config.json's `key`, or null when absent or null.
inline const nlohmann::json* find_key(const nlohmann::json& config, const std::string& key) {
  return config.contains(key) && !config[key].is_null() ? &config[key] : nullptr;
}

// config.json's `key` as an integer, number, boolean or string (`fallback` when absent or null);
// ConfigError naming the key for a value of another type.
inline int64_t int_or(const nlohmann::json& config, const std::string& key, int64_t fallback) {
  const nlohmann::json* v = find_key(config, key);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer()) {
    throw ConfigError(message("config.json \"", key, "\" must be an integer, got ", v->dump()));
  }
  return v->get<int64_t>();
}

inline double number_or(const nlohmann::json& config, const std::string& key, double fallback) {
  const nlohmann::json* v = find_key(config, key);
  if (v == nullptr) return fallback;
  if (!v->is_number()) {
    throw ConfigError(message("config.json \"", key, "\" must be a number, got ", v->dump()));
  }
  return v->get<double>();
}

inline bool bool_or(const nlohmann::json& config, const std::string& key, bool fallback) {
  const nlohmann::json* v = find_key(config, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) {
    throw ConfigError(message("config.json \"", key, "\" must be true or false, got ", v->dump()));
  }
  return v->get<bool>();
}

inline std::string string_or(const nlohmann::json& config, const std::string& key,
                             const std::string& fallback) {
  const nlohmann::json* v = find_key(config, key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) {
    throw ConfigError(message("config.json \"", key, "\" must be a string, got ", v->dump()));
  }
  return v->get<std::string>();
}

}  // namespace titan::hf
