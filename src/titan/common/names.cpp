// Edit distance and the nearest-name choices behind every "did you mean".
#include "titan/common/names.h"

#include <algorithm>
#include <cstdint>

namespace titan {

size_t edit_distance(std::string_view a, std::string_view b) {
  // One row of the (|a|+1) x (|b|+1) table at a time: row[j] = distance(a[:i], b[:j]).
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];  // distance(a[:i-1], b[:j-1])
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({above + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Names from input longer than this are no typo of a known one: no suggestion, and no edit
// distance over megabytes.
constexpr size_t kMaxSuggestedFrom = 256;

std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates) {
  if (name.size() > kMaxSuggestedFrom) return "";
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& candidate : candidates) {
    const size_t distance = edit_distance(name, candidate);
    if (distance < best_distance) {  // strictly: on a tie the earlier candidate stays
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string likely_name(const std::string& name, const std::vector<std::string>& candidates) {
  if (name.size() > kMaxSuggestedFrom) return "";
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& candidate : candidates) {
    const bool extends = !name.empty() && candidate.compare(0, name.size(), name) == 0;
    const size_t distance = extends ? 0 : edit_distance(name, candidate);
    const bool close = extends || distance <= std::max<size_t>(2, candidate.size() / 3);
    if (close && distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string did_you_mean(const std::string& nearest) {
  return nearest.empty() ? std::string() : "; did you mean '" + nearest + "'?";
}

}  // namespace titan
