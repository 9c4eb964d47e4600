// How far titan.cpp implements a config key. JobConfig carries every key of TorchTitan's job
// config so that its TOML files load unchanged; a key whose feature is not built yet says so with
// the optional fourth argument of its section's visit call:
//
//   v("enable_profiling", enable_profiling, "...", kNotYet);
//   v("profile_freq", profile_freq, "...", used_with("profiling.enable_profiling"));
//
// validate_job_config() refuses a kNotYet key set away from its default, naming the key; --help
// marks both kinds. Building a feature means dropping these markers from its keys.
#pragma once

namespace titan {

struct KeySupport {
  enum Kind {
    kYes,      // works as in TorchTitan
    kNotYet,   // the feature is not built: only the default is accepted, any other value is a
               // ConfigError naming the key
    kUsedWith  // read only by the feature that `switch_key` turns on, which is not built yet
               // (its switch is refused), so any value is accepted and none has an effect, as in
               // TorchTitan with that feature off
  };
  Kind kind = kYes;
  const char* switch_key = "";  // kUsedWith: the full name of the switch ("compile.enable")
};

inline constexpr KeySupport kSupported{KeySupport::kYes, ""};
inline constexpr KeySupport kNotYet{KeySupport::kNotYet, ""};
constexpr KeySupport used_with(const char* switch_key) {
  return KeySupport{KeySupport::kUsedWith, switch_key};
}

}  // namespace titan
