// Reads dataset files and checks them against a compiled-in manifest.
#include "titan/components/data/manifest.h"

#include "titan/common/check.h"

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace titan {

namespace fs = std::filesystem;

uint64_t fnv1a64(std::string_view data) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (char c : data) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

namespace {

std::string hex64(uint64_t value) {
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << value;
  return os.str();
}

}  // namespace

std::vector<Document> read_verified_documents(const std::string& dataset, const std::string& dir,
                                              const std::vector<ManifestEntry>& entries,
                                              const std::string& setup_command) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw DataError("dataset '" + dataset + "' not found at " + dir + "; run " + setup_command +
                    " to fetch it");
  }
  const std::string hint = ". HINT: the cached copy is incomplete or corrupt; delete the folder " +
                           dir + " and re-run " + setup_command + " to fetch it again";

  std::vector<Document> docs;
  docs.reserve(entries.size());
  for (const ManifestEntry& entry : entries) {
    const std::string name(entry.filename);
    const fs::path path = fs::path(dir) / name;
    const std::string where = "dataset '" + dataset + "': file " + path.string();
    if (!fs::is_regular_file(path, ec)) {
      throw DataError(where + " is missing" + hint);
    }
    const auto size = static_cast<int64_t>(fs::file_size(path, ec));
    if (ec || size != entry.size) {
      throw DataError(where + " has " + std::to_string(size) + " bytes, the manifest expects " +
                      std::to_string(entry.size) + hint);
    }
    std::ifstream in(path, std::ios::binary);
    std::string text(static_cast<size_t>(size), '\0');
    if (!in || !in.read(text.data(), size)) {
      throw DataError(where + " could not be read" + hint);
    }
    const uint64_t hash = fnv1a64(text);
    if (hash != entry.fnv1a64) {
      throw DataError(where + " has FNV-1a hash " + hex64(hash) + ", the manifest expects " +
                      hex64(entry.fnv1a64) + hint);
    }
    docs.push_back(Document{name, std::move(text)});
  }
  return docs;
}

}  // namespace titan
