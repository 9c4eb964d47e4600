// The "did you mean" behind every unknown-name error (config sections and keys, datasets, models,
// flavors, model arguments): edit distance, the nearest candidate, and the phrase itself.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

// Levenshtein distance: insertions, deletions and substitutions each cost 1.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `name` by edit distance, the earlier one on a tie; empty if
// `candidates` is empty.
std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates);

// The candidate `name` is likely a typo or a shortening of: the first one that starts with `name`
// ("sotu_val" -> "sotu_validation"), else the nearest within max(2, its length / 3) edits; empty
// when none is that close ("zzz" suggests nothing).
std::string likely_name(const std::string& name, const std::vector<std::string>& candidates);

// "; did you mean 'x'?" for x = `nearest`, or "" when `nearest` is empty.
std::string did_you_mean(const std::string& nearest);

}  // namespace titan
