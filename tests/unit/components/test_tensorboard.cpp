// TensorBoard event files: CRC-32C against the published vectors (RFC 3720, B.4), TFRecord
// framing and Event encoding byte for byte against records written by TensorBoard's own Python
// writer (tensorboard 2.21.0, RecordWriter and event_pb2), TorchTitan's folder layout, and a
// MetricsLogger run whose event file, decoded here, holds every metrics.jsonl value.
#include "titan/common/check.h"
#include "titan/components/metrics.h"
#include "titan/components/tensorboard.h"

#include "../test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>

namespace titan {
namespace tensorboard_test {

namespace fs = std::filesystem;

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

uint64_t little_endian(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes.size(); ++i) v |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  return v;
}

TEST(Crc32c, MatchesThePublishedVectors) {
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
  // Continuing from a prefix's CRC gives the CRC of the whole.
  EXPECT_EQ(crc32c("6789", crc32c("12345")), 0xE3069283u);
}

TEST(Crc32c, MaskRotatesAndAddsTheConstant) {
  EXPECT_EQ(masked_crc32c(""), 0xa282ead8u);
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(TfRecord, FramesLengthAndDataWithTheirMaskedCrcs) {
  const std::string data = "some event bytes";
  const std::string record = tfrecord(data);
  ASSERT_EQ(record.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(little_endian(record.substr(0, 8)), data.size());
  EXPECT_EQ(little_endian(record.substr(8, 4)), masked_crc32c(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, data.size()), data);
  EXPECT_EQ(little_endian(record.substr(12 + data.size(), 4)), masked_crc32c(data));
}

TEST(TfRecord, EventsEqualTensorBoardsOwnWriterByteForByte) {
  // Event(wall_time=1.5, file_version="brain.Event:2"), serialized and framed by tensorboard.
  const std::string version = file_version_event(1.5);
  EXPECT_EQ(version, from_hex("09000000000000f83f1a0d627261696e2e4576656e743a32"));
  EXPECT_EQ(tfrecord(version), from_hex("1800000000000000a37f4b2209000000000000f83f1a0d627261696e"
                                        "2e4576656e743a322a28646c"));
  // Event(wall_time=1.5, step=300, summary=Summary(value=[Value(tag="lr", simple_value=0.5)])).
  const std::string scalars = scalars_event(1.5, 300, {{"lr", 0.5}});
  EXPECT_EQ(scalars, from_hex("09000000000000f83f10ac022a0b0a090a026c72150000003f"));
  EXPECT_EQ(tfrecord(scalars), from_hex("19000000000000008bf1082809000000000000f83f10ac022a0b0a09"
                                        "0a026c72150000003f15ee0068"));
}

// --- A reader for the few Event fields written (the test's own, independent of the writer). ---

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::map<std::string, float> scalars;
};

uint64_t read_varint(std::string_view& in) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    EXPECT_FALSE(in.empty());
    if (in.empty()) return v;
    const uint8_t b = static_cast<uint8_t>(in[0]);
    in.remove_prefix(1);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

// Calls f(field, wire type, payload) for each field; varint payloads are returned decoded in
// `number`, fixed ones as bytes.
template <class F>
void for_each_field(std::string_view in, F f) {
  while (!in.empty()) {
    const uint64_t key = read_varint(in);
    const int field = static_cast<int>(key >> 3), type = static_cast<int>(key & 7);
    std::string_view bytes;
    uint64_t number = 0;
    if (type == 0) {
      number = read_varint(in);
    } else {
      const size_t n = type == 1 ? 8 : type == 5 ? 4 : read_varint(in);
      ASSERT_TRUE(type == 1 || type == 5 || type == 2) << "wire type " << type;
      ASSERT_LE(n, in.size());
      bytes = in.substr(0, n);
      in.remove_prefix(n);
    }
    f(field, type, bytes, number);
  }
}

DecodedEvent decode_event(std::string_view data) {
  DecodedEvent e;
  for_each_field(data, [&](int field, int, std::string_view bytes, uint64_t number) {
    if (field == 1) {
      const uint64_t bits = little_endian(bytes);
      std::memcpy(&e.wall_time, &bits, 8);
    } else if (field == 2) {
      e.step = static_cast<int64_t>(number);
    } else if (field == 3) {
      e.file_version = std::string(bytes);
    } else if (field == 5) {
      for_each_field(bytes, [&](int, int, std::string_view value, uint64_t) {
        std::string tag;
        float simple = 0;
        for_each_field(value, [&](int f, int, std::string_view b, uint64_t) {
          if (f == 1) tag = std::string(b);
          if (f == 2) {
            const uint32_t bits = static_cast<uint32_t>(little_endian(b));
            std::memcpy(&simple, &bits, 4);
          }
        });
        e.scalars[tag] = simple;
      });
    }
  });
  return e;
}

// The events of an event file, every frame's CRCs checked.
std::vector<DecodedEvent> read_events(const fs::path& path) {
  const std::string bytes = file_bytes(path);
  std::string_view in = bytes;
  std::vector<DecodedEvent> events;
  while (!in.empty()) {
    EXPECT_GE(in.size(), 12u);
    if (in.size() < 12) break;
    const uint64_t n = little_endian(in.substr(0, 8));
    EXPECT_EQ(little_endian(in.substr(8, 4)), masked_crc32c(in.substr(0, 8)));
    EXPECT_GE(in.size(), 16 + n);
    if (in.size() < 16 + n) break;
    EXPECT_EQ(little_endian(in.substr(12 + n, 4)), masked_crc32c(in.substr(12, n)));
    events.push_back(decode_event(in.substr(12, n)));
    in.remove_prefix(16 + n);
  }
  return events;
}

TEST(TensorBoardFolder, FollowsTorchTitansLayout) {
  const char* tz = std::getenv("TZ");
  const std::string saved_tz = tz ? tz : "";
  setenv("TZ", "UTC", 1);
  tzset();
  MetricsSection m;
  const int64_t t = 1764633600 + 3600 * 5 + 60 * 7;  // 2025-12-02 05:07 UTC
  EXPECT_EQ(tensorboard_folder(m, "out", 3, t), "out/tb/20251202-0507");
  m.save_tb_folder = "runs/tb";
  m.save_for_all_ranks = true;
  EXPECT_EQ(tensorboard_folder(m, "./out/", 3, t), "out/runs/tb/20251202-0507/rank_3");
  if (tz) {
    setenv("TZ", saved_tz.c_str(), 1);
  } else {
    unsetenv("TZ");
  }
  tzset();
}

TEST(TensorBoardWriter, AnUnwritableFolderIsADataErrorNamingIt) {
  const auto dir = test::fresh_test_dir("titan_test_tb_bad");
  std::ofstream(dir / "file") << "x";
  const std::string msg =
      test::message_of([&] { TensorBoardWriter w((dir / "file" / "tb").string()); });
  EXPECT_TRUE(
      test::contains(msg, "cannot create the TensorBoard folder " + (dir / "file" / "tb").string()))
      << msg;
  fs::remove_all(dir);
}

TEST(TensorBoardWriter, MetricsLoggerWritesEveryJsonlValueAsAScalar) {
  const auto dir = test::fresh_test_dir("titan_test_tb_logger");
  MetricsSection cfg;
  cfg.log_freq = 2;
  cfg.disable_color_printing = true;
  cfg.enable_tensorboard = true;
  std::string event_path;
  {
    MetricsLogger logger(cfg, dir.string(), 1e6, 1e12, /*total_steps=*/5, true);
    event_path = logger.tensorboard_path();
    for (int64_t step = 1; step <= 5; ++step) {
      logger.on_step(step, 100, [&] {
        return LoggedValues{3.0 - 0.1 * step, 0.5 + step, 1e-3 * step};
      });
    }
    logger.log_validation(5, 2.25, 64, 0.1);
    logger.close();
  }
  ASSERT_FALSE(event_path.empty());
  EXPECT_EQ(fs::path(event_path).parent_path().parent_path(), dir / "tb");
  EXPECT_EQ(fs::path(event_path).filename().string().rfind("events.out.tfevents.", 0), 0u);

  const std::vector<DecodedEvent> events = read_events(event_path);
  ASSERT_EQ(events.size(), 1u + 4u + 1u);  // version, steps 1, 2, 4, 5, validation at 5
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.5e9);
  const std::map<std::string, std::string> jsonl_key = {
      {"loss_metrics/global_avg_loss", "loss"},
      {"grad_norm", "grad_norm"},
      {"lr", "lr"},
      {"throughput(tps)", "tps"},
      {"tflops", "tflops"},
      {"mfu(%)", "mfu"},
      {"time_metrics/end_to_end(s)", "time_metrics/end_to_end(s)"},
      {"memory/max_rss(GiB)", "memory_gib"},
      {"memory/max_rss(%)", "memory_pct"},
      {"validation_metrics/loss", "validation_loss"},
      {"validation_metrics/perplexity", "validation_perplexity"}};
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  size_t i = 1;
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line);
    ASSERT_LT(i, events.size());
    const DecodedEvent& e = events[i++];
    EXPECT_EQ(e.step, row["step"].get<int64_t>());
    size_t matched = 0;
    for (const auto& [tag, key] : jsonl_key) {
      if (!row.contains(key)) continue;
      ++matched;
      ASSERT_TRUE(e.scalars.count(tag)) << tag << " missing at step " << e.step;
      const double want = row[key].get<double>();
      EXPECT_NEAR(e.scalars.at(tag), want, 1e-6 * std::max(1.0, std::abs(want))) << tag;
    }
    EXPECT_EQ(matched, e.scalars.size()) << line;
  }
  EXPECT_EQ(i, events.size());
  fs::remove_all(dir);
}

}  // namespace tensorboard_test
}  // namespace titan
