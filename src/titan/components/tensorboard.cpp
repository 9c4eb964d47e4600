// TensorBoard event files: CRC-32C, TFRecord framing and the hand-encoded Event protobuf (the wire
// format: each field is a varint key (field number << 3 | wire type) followed by a varint,
// 8 bytes, 4 bytes, or a varint length and that many bytes).
#include "titan/components/tensorboard.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace titan {

namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf wire types.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_little_endian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, field << 3 | type);
}

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  put_key(out, field, kFixed64);
  put_little_endian(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  put_key(out, field, kFixed32);
  put_little_endian(out, bits, 4);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event fields.
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
// Summary.value, Summary.Value.tag and .simple_value.
constexpr uint32_t kValue = 1, kTag = 1, kSimpleValue = 2;

std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_double(event, kWallTime, wall_time);
  if (step != 0) {  // proto3 leaves default values out
    put_key(event, kStep, kVarint);
    put_varint(event, static_cast<uint64_t>(step));  // two's complement, as protobuf's int64
  }
  return event;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The host part of an event file's name ("localhost" when unknown: a file name, so never "?").
std::string event_file_host() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (const char c : data) crc = kCrc32cTable[(crc ^ static_cast<uint8_t>(c)) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  put_little_endian(record, data.size(), 8);
  put_little_endian(record, masked_crc32c(record), 4);
  record.append(data);
  put_little_endian(record, masked_crc32c(data), 4);
  return record;
}

std::string file_version_event(double wall_time) {
  std::string event = event_header(wall_time, /*step=*/0);
  put_bytes(event, kFileVersion, "brain.Event:2");
  return event;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& scalars) {
  std::string summary;
  for (const Scalar& s : scalars) {
    std::string value;
    put_bytes(value, kTag, s.tag);
    put_float(value, kSimpleValue, static_cast<float>(s.value));
    put_bytes(summary, kValue, value);
  }
  std::string event = event_header(wall_time, step);
  put_bytes(event, kSummary, summary);
  return event;
}

std::string tensorboard_folder(const MetricsSection& config, const std::string& dump_folder,
                               int64_t rank, int64_t started) {
  const std::time_t t = static_cast<std::time_t>(started);
  std::tm local{};
  localtime_r(&t, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M", &local);
  std::filesystem::path folder = std::filesystem::path(dump_folder) / config.save_tb_folder / stamp;
  if (config.save_for_all_ranks) folder /= "rank_" + std::to_string(rank);
  return folder.lexically_normal().string();
}

TensorBoardWriter::TensorBoardWriter(const std::string& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) {
    throw DataError("cannot create the TensorBoard folder " + folder + ": " + ec.message() +
                    ". HINT: check metrics.save_tb_folder and job.dump_folder");
  }
  // The counter keeps two writers of one process apart within a second (TensorFlow's uid).
  static std::atomic<int> writers{0};
  const double now = now_seconds();
  path_ = (std::filesystem::path(folder) /
           ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." +
            event_file_host() + "." + std::to_string(getpid()) + "." + std::to_string(writers++)))
              .string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw DataError("cannot create TensorBoard event file " + path_ + ": " + std::strerror(errno));
  }
  append(file_version_event(now));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<Scalar>& scalars) {
  append(scalars_event(now_seconds(), step, scalars));
}

void TensorBoardWriter::append(std::string_view event) {
  if (fd_ >= 0) write_all(fd_, tfrecord(event), path_);
}

void TensorBoardWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  close_checked(fd, path_);
}

}  // namespace titan
