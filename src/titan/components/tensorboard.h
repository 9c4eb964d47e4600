// TensorBoard event files, written without TensorFlow or a protobuf library.
//
// An event file is a sequence of TFRecords: a little-endian uint64 length, the masked CRC32C of
// those 8 bytes, the payload, the masked CRC32C of the payload. Each payload is a serialized
// tensorflow.Event protobuf, encoded here by hand from the few fields TensorBoard needs:
//   Event         { double wall_time = 1; int64 step = 2; string file_version = 3;
//                   Summary summary = 5; }
//   Summary       { repeated Value value = 1; }
//   Summary.Value { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2"; every later one a step's scalars.
//
// Layout (TorchTitan's): <dump_folder>/<metrics.save_tb_folder>/<YYYYmmdd-HHMM>/, plus rank_<r>/
// under metrics.save_for_all_ranks; the file is named events.out.tfevents.<unix time>.<host>.
// <pid>.<n>, as TensorFlow names them. Each step's record goes out in one write(2), so a crash
// loses at most the step being written.
#pragma once

#include "titan/config/job_config.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`, continuing from `crc` (the CRC
// of the bytes before `data`; 0 to start).
uint32_t crc32c(std::string_view data, uint32_t crc = 0);

// TFRecord's masked CRC: rotate right by 15 bits, add 0xa282ead8 (so a CRC stored inside data
// that is CRC'd again does not cancel out).
uint32_t masked_crc32c(std::string_view data);

// `data` framed as one TFRecord (length, masked CRC of the length, data, masked CRC of the data).
std::string tfrecord(std::string_view data);

struct Scalar {
  std::string tag;
  double value;  // stored as float (TensorBoard's simple_value)
};

// A serialized Event holding only the file version ("brain.Event:2").
std::string file_version_event(double wall_time);
// A serialized Event holding `scalars` at `step`, one Summary.Value each.
std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& scalars);

// The folder rank `rank` writes its event file to, TorchTitan's layout (top of this file), the
// timestamp folder named from `started` (Unix seconds) in local time.
std::string tensorboard_folder(const MetricsSection& config, const std::string& dump_folder,
                               int64_t rank, int64_t started);

class TensorBoardWriter {
 public:
  // Creates `folder` and a new event file in it holding the file-version record; DataError naming
  // the file and the errno text when either cannot be written.
  explicit TensorBoardWriter(const std::string& folder);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends one record with `scalars` at `step`, stamped with the current time.
  void add_scalars(int64_t step, const std::vector<Scalar>& scalars);
  const std::string& path() const { return path_; }
  // Closes the file, throwing DataError when the close reports a lost write.
  void close();

 private:
  void append(std::string_view event);

  std::string path_;
  int fd_ = -1;
};

}  // namespace titan
