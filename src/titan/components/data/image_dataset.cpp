#include "titan/components/data/image_dataset.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/components/data/image.h"

#include <filesystem>

namespace titan {

namespace fs = std::filesystem;

ImageCaptionSource::ImageCaptionSource(const std::string& path, ImageDatasetOptions options)
    : options_(std::move(options)) {
  if (path == "shapes") {
    shapes_.emplace(options_.shapes_size, options_.shapes_seed);
    TITAN_CHECK(options_.shapes_count > 0, "shapes: ", options_.shapes_count, " samples");
    return;
  }
  CorpusSettings settings;
  settings.path = options_.path_key;
  records_ = open_records(path, settings);
  std::error_code ec;
  root_ = fs::is_directory(path, ec) ? path : fs::path(path).parent_path().string();
  if (records_->size() == 0) {
    throw DataError(message("image dataset ", path, " has no rows"));
  }
}

int64_t ImageCaptionSource::size() const {
  return shapes_ ? options_.shapes_count : records_->size();
}

ImageCaption ImageCaptionSource::get(int64_t i) const {
  TITAN_CHECK(i >= 0 && i < size(), "image dataset: row ", i, " of ", size());
  if (shapes_) {
    ShapeSample s = shapes_->get(i);
    return {std::move(s.image), std::move(s.caption), message("shapes sample ", i)};
  }
  const std::string where = records_->describe(i);
  const nlohmann::ordered_json row = records_->record(i);
  const auto field = [&](const std::string& name) -> const nlohmann::ordered_json& {
    if (!row.is_object() || !row.contains(name)) {
      throw DataError(message(
          where, ": no \"", name, "\" field (image datasets read the image from \"",
          options_.image_field, "\" and the caption from \"", options_.caption_field, "\")"));
    }
    return row.at(name);
  };
  const nlohmann::ordered_json& caption = field(options_.caption_field);
  if (!caption.is_string()) {
    throw DataError(message(where, ": \"", options_.caption_field, "\" is not a string"));
  }
  const nlohmann::ordered_json* image = &field(options_.image_field);
  // Hugging Face's Image feature: {"bytes": ..., "path": ...}; the bytes when there are some.
  if (image->is_object()) {
    const bool has_bytes = image->contains("bytes") && (*image)["bytes"].is_string() &&
                           !(*image)["bytes"].get_ref<const std::string&>().empty();
    if (has_bytes) {
      image = &(*image)["bytes"];
    } else if (image->contains("path") && (*image)["path"].is_string()) {
      image = &(*image)["path"];
    } else {
      throw DataError(message(where, ": \"", options_.image_field,
                              "\" is an object without \"bytes\" or \"path\""));
    }
  }
  if (!image->is_string()) {
    throw DataError(
        message(where, ": \"", options_.image_field, "\" is neither a path nor image bytes"));
  }
  const std::string& value = image->get_ref<const std::string&>();
  if (sniff_image_format(value) != ImageFormat::kUnknown) {
    return {decode_image(value, where), caption.get<std::string>(), where};
  }
  // A path: absolute, or from the folder of the dataset files.
  const fs::path file = fs::path(value).is_absolute() ? fs::path(value) : fs::path(root_) / value;
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    throw DataError(message(where, ": image file ", file.string(), " does not exist"));
  }
  const std::string origin = message(where, " (", file.string(), ")");
  return {decode_image(read_regular_file(file.string(), "image file"), origin),
          caption.get<std::string>(), origin};
}

std::pair<int64_t, ImageCaption> ImageCaptionSource::next_readable(int64_t i, bool skip_unreadable,
                                                                   int64_t* skipped) const {
  const int64_t n = size();
  for (int64_t tried = 0; tried < n; ++tried) {
    const int64_t row = (i + tried) % n;
    try {
      return {row, get(row)};
    } catch (const DataError& e) {
      if (!skip_unreadable) throw;
      log_warning("image dataset: skipping a row that does not read: ", e.what());
      if (skipped != nullptr) ++*skipped;
    }
  }
  throw DataError(message("image dataset: none of its ", n, " rows reads"));
}

std::optional<ImageCaption> ImageRowCursor::next(const ImageCaptionSource& source, bool infinite,
                                                 bool skip_unreadable) {
  const int64_t rows = source.size();
  while (true) {
    if (row >= rows) {
      if (!infinite) return std::nullopt;
      row = 0;
      ++epoch;
    }
    int64_t skipped = 0;
    auto [index, sample] = source.next_readable(row, skip_unreadable, &skipped);
    unreadable += skipped;
    if (index < row) {  // wrapped past the end: the rest of the pass was unreadable
      row = rows;
      continue;
    }
    row = index + 1;
    return std::move(sample);
  }
}

}  // namespace titan
