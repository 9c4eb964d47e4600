// Name checks shared by the model registry and the models' argument parsers: the "did you mean"
// suggestion and the flavor check. Kept apart from registry.cpp, which pulls in every builtin
// model, so that a parser (llama3/args.cpp) links without the model code (the fuzz build,
// tests/fuzz, compiles only the parsers).
#include "titan/models/registry.h"

#include "titan/common/check.h"

#include <algorithm>
#include <sstream>

namespace titan {
namespace {

// Levenshtein distance: insertions, deletions and substitutions each cost 1.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];  // distance(a[:i-1], b[:j-1])
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string suggestion(const std::string& name, const std::vector<std::string>& candidates,
                       const std::string& kind) {
  std::ostringstream os;
  if (!candidates.empty()) {
    const auto nearest = std::min_element(candidates.begin(), candidates.end(),
                                          [&](const std::string& x, const std::string& y) {
                                            return edit_distance(name, x) < edit_distance(name, y);
                                          });
    os << "; did you mean '" << *nearest << "'?";
  }
  os << " (" << kind << ": ";
  for (size_t i = 0; i < candidates.size(); ++i) {
    os << (i ? ", " : "") << candidates[i];
  }
  os << ")";
  return os.str();
}

void check_flavor(const std::string& model, const std::vector<std::string>& flavors,
                  const std::string& flavor) {
  if (std::find(flavors.begin(), flavors.end(), flavor) != flavors.end()) {
    return;
  }
  throw ConfigError("unknown model.flavor '" + flavor + "' for model '" + model + "'" +
                    suggestion(flavor, flavors, "flavors"));
}

}  // namespace titan
