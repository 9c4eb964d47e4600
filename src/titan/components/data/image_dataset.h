// Image-caption datasets, the data of the image models: rows of a record source (record_source.h:
// JSON lines, JSON or parquet, a file or a folder of them) whose image field holds either
//   - a file path (a folder of images with a captions sidecar: {"image": "cats/1.jpg",
//     "caption": "..."} per line; relative paths from the folder that holds the dataset files),
//   - the image's bytes (a parquet binary column), or
//   - Hugging Face's Image feature, an object {"bytes": ..., "path": ...} (bytes preferred),
// and whose caption field holds the text. Images decode to (3, height, width) uint8 RGB
// (image.h). Or the built-in procedural set: path "shapes" (shapes.h).
//
// A row that cannot be read (a missing field, a missing or corrupt image) throws DataError naming
// the row ("captions.jsonl:12", "train.parquet row 7") and the image; next_readable() moves past
// such rows only when the caller allows skipping, and counts them.
#pragma once

#include "titan/components/data/record_source.h"
#include "titan/components/data/shapes.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace titan {

struct ImageCaption {
  at::Tensor image;  // (3, height, width) uint8 RGB
  std::string caption;
  std::string origin;  // where the row comes from, for messages
};

struct ImageDatasetOptions {
  std::string image_field = "image";
  std::string caption_field = "caption";
  int64_t shapes_size = 64;                        // the procedural images' side
  uint64_t shapes_seed = 0;                        // and their generator's seed
  int64_t shapes_count = 10000;                    // how many samples the procedural set has
  std::string path_key = "training.dataset_path";  // names the setting in hints
};

class ImageCaptionSource {
 public:
  // `path`: "shapes", or a dataset file or folder (see above). Throws DataError.
  ImageCaptionSource(const std::string& path, ImageDatasetOptions options = {});

  int64_t size() const;
  // Row i, decoded; DataError when it cannot be read.
  ImageCaption get(int64_t i) const;
  // The first row from i on (wrapping around once) that reads, with its index; rows that do not
  // read are skipped when `skip_unreadable`, each counted in `*skipped` (if given), else the first
  // such row's DataError propagates. DataError too when no row of the whole set reads.
  std::pair<int64_t, ImageCaption> next_readable(int64_t i, bool skip_unreadable,
                                                 int64_t* skipped = nullptr) const;

 private:
  ImageDatasetOptions options_;
  std::shared_ptr<const RecordSource> records_;  // null for the shapes
  std::optional<ShapesDataset> shapes_;
  std::string root_;  // where relative image paths start
};

// Where a loader stands in an image-caption source: rows in order, a pass after another (or one
// pass), unreadable rows skipped and counted when allowed (next_readable's rule).
struct ImageRowCursor {
  int64_t row = 0;         // the next row to read
  int64_t epoch = 0;       // completed passes
  int64_t unreadable = 0;  // rows passed over
  // The next readable row's sample, or nullopt at the end of a pass when not `infinite`.
  std::optional<ImageCaption> next(const ImageCaptionSource& source, bool infinite,
                                   bool skip_unreadable);
};

}  // namespace titan
